"""Where a decode-size launch of the repacked W4A16 kernel spends its time, without a profiler.

The kernel (kernels/triton/w4a16_marlin.py) at M = 1 under its config for the GPU, beside
kernels that do part of its work on the same grid, tiles, split and pipeline depth, all timed
side by side in CUDA graphs (w4a16_sweep.time_alternating) with bf16 cuBLAS:

  launch        the grid's programs start and return: the launch and scheduling floor
  stream        each program loads its x, packed-weight, zero and scale tiles as the kernel
                does (the same addresses and masks, pipelined num_stages deep), multiplies
                an eighth as many folded weights and stores its product: the memory floor
                of this decomposition (its K step is about half the kernel's instructions
                on sm_90, 146 against 294, the address arithmetic and copies being common)
  stream_deep   the same, 8 stages deep: whether more loads in flight lower that floor
  stream_fixup  stream, then the kernel's own split-K epilogue (w4a16_gemm._finish_tile:
                partials, arrival counter, the last program's sum): what the split costs
  marlin        the kernel itself
  bf16          cuBLAS on the dense weight, the yardstick

So marlin - stream_fixup is the dequantisation and MMA time the loads did not hide,
stream_fixup - stream the split's epilogue, stream - launch the streaming. Each part-kernel's
registers, shared memory and the programs an SM holds of it ride along: one may fit more
programs on an SM than the kernel does (the kernel's own usage is the AOT table's,
benchmarks/compile_for_gpu.py: sm_90, M <= 16, fp16 or bf16: 88 registers, 25 KB). Every
part-kernel's result is checked against the same product in torch before it is timed (to
fp32's and the activations' rounding), so a wrong one fails.
"""

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.w4a16_repack import TILE_N, RepackedW4
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.w4a16_gemm import _finish_tile, _split_counters

M = 1
DEEP_STAGES = 8


@triton.jit
def _launch_floor_kernel(sink_ptr):
    """Starts and returns (sink_ptr is never written): what a launch of the grid costs."""
    pass


@jit(do_not_specialize=("M", "split_k"))
def _stream_kernel(
    x_ptr, qw_ptr, z_ptr, s_ptr, out_ptr, partial_ptr, counter_ptr,
    M, N, K, k_per_split, split_k,
    stride_xm, stride_xk, stride_qwt, stride_zg, stride_sg, stride_om,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    TILE: tl.constexpr, SPLIT_K: tl.constexpr, FIXUP: tl.constexpr,
):
    """The repacked kernel's loads (its grid, tiles and addresses) with an eighth of its math:
    each packed word XOR its column's zero, times the scale, is one weight of a [BLOCK_K / 8,
    BLOCK_N] tile that multiplies x summed over each 8 of its columns (a tile feeds a dot, so
    Triton pipelines its loads as it does the kernel's). The product goes to the program's
    slot of `partial` (FIXUP: through the kernel's split-K epilogue into `out`)."""
    tl.static_assert(BLOCK_K >= 128, "the folded tile's K (BLOCK_K / 8) must be at least 16 for tl.dot")
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    columns = (offs_n // TILE) * stride_qwt + offs_n % TILE
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(scalar(k_start), scalar(k_end), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=mask_m[:, None], other=0.0)
        offs_p = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(qw_ptr + offs_p[:, None] * TILE + columns[None, :], mask=mask_n[None, :], other=0)
        group = k0 // GROUP_SIZE
        z = tl.load(z_ptr + group * stride_zg + offs_n, mask=mask_n, other=0)
        scale = tl.load(s_ptr + group * stride_sg + offs_n, mask=mask_n, other=0.0)
        folded_x = tl.sum(tl.reshape(x.to(tl.float32), (BLOCK_M, BLOCK_K // 8, 8)), axis=2).to(x.dtype)
        folded_w = ((packed ^ z.to(tl.int32)[None, :]) & 0xFF).to(x.dtype) * scale[None, :].to(x.dtype)
        acc = tl.dot(folded_x, folded_w, acc)
    if FIXUP:
        _finish_tile(acc, out_ptr, out_ptr, partial_ptr, counter_ptr, M, N, offs_m, offs_n, mask_m,
                     mask_n, stride_om, pid_m, pid_n, pid_k, split_k, BLOCK_M, BLOCK_N, False, SPLIT_K)
    else:
        tl.store(partial_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc,
                 mask=mask_m[:, None] & mask_n[None, :])


class Launches:
    """The part-kernels of one (x, weight, config) launch, shaped as w4a16_matmul_marlin shapes
    it; each keeps its compiled kernel's registers and shared memory (on a GPU)."""

    def __init__(self, x: torch.Tensor, w: RepackedW4, config) -> None:
        self.x, self.w, self.config = x, w, config
        m, k = x.shape
        self.k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
        self.split_k = triton.cdiv(k, self.k_per_split)
        self.grid = (triton.cdiv(m, config.block_m), triton.cdiv(w.n, config.block_n), self.split_k)
        self.partial = torch.empty((self.split_k, m, w.n), dtype=torch.float32, device=x.device)
        self.out = torch.empty((m, w.n), dtype=torch.float32, device=x.device)
        self.usage: dict[str, dict] = {}

    def empty(self) -> None:
        self._record("launch", launch(_launch_floor_kernel, self.grid, self.out))

    def stream(self, fixup: bool = False, num_stages: int | None = None) -> torch.Tensor:
        """The loads and folded product: each split's product in `partial` [split, M, N], or
        (fixup) their sum through the split-K epilogue in `out` [M, N]."""
        x, w, cfg = self.x, self.w, self.config
        counters = (_split_counters.get(x.device, self.grid[0] * self.grid[1])
                    if fixup and self.split_k > 1 else self.out)  # else an unused placeholder
        if w.zeros is None:
            raise ValueError("the anatomy streams an asymmetric (AWQ) weight: it has zeros")
        zeros = w.zeros
        compiled = launch(
            _stream_kernel, self.grid,
            x, w.qweight, zeros, w.scales, self.out, self.partial, counters,
            x.shape[0], w.n, w.k, self.k_per_split, self.split_k,
            x.stride(0), x.stride(1), w.qweight.stride(0), zeros.stride(0), w.scales.stride(0),
            self.out.stride(0),
            GROUP_SIZE=w.group_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            TILE=TILE_N, SPLIT_K=self.split_k > 1, FIXUP=fixup, num_warps=cfg.num_warps,
            num_stages=num_stages or cfg.num_stages)
        name = "stream_fixup" if fixup else "stream" if num_stages is None else "stream_deep"
        self._record(name, compiled)
        return self.out if fixup else self.partial

    def _record(self, name: str, compiled) -> None:
        if name not in self.usage and getattr(compiled, "n_regs", None) is not None:
            self.usage[name] = {"registers": compiled.n_regs, "shared_bytes": compiled.metadata.shared}


def folded_products(launches: Launches) -> torch.Tensor:
    """What `_stream_kernel` computes, in torch: [split, M, N] fp32, each split's product of x
    summed over 8-column groups and the folded weights ((word ^ zero) & 0xFF) * scale."""
    x, w = launches.x, launches.w
    m, k = x.shape
    n_pad = w.qweight.shape[0] * TILE_N
    words = w.qweight.permute(1, 0, 2).reshape(k // 8, n_pad)[:, :w.n]  # word (p, n)
    groups = torch.arange(k // 8, device=x.device) * 8 // w.group_size
    zeros, scales = w.zeros[groups, :w.n].to(torch.int32), w.scales[groups, :w.n]
    folded_w = ((words ^ zeros) & 0xFF).to(x.dtype) * scales.to(x.dtype)
    folded_x = x.float().view(m, k // 8, 8).sum(dim=2).to(x.dtype)
    per_split = launches.k_per_split // 8
    return torch.stack([folded_x[:, p:p + per_split].float() @ folded_w[p:p + per_split].float()
                        for p in range(0, k // 8, per_split)])


def check_launches(launches: Launches) -> None:
    """Raise unless the part-kernels wrote what torch says they should (each split's product;
    through the epilogue, their sum in split order)."""
    want = folded_products(launches)
    tolerance = 1e-2 * float(want.abs().max()) + 1e-3
    got = launches.stream().clone()
    if float((got - want).abs().max()) > tolerance:
        raise AssertionError(f"the stream kernel's products are off by {float((got - want).abs().max())}")
    got = launches.stream(fixup=True).clone()
    if float((got - want.sum(dim=0)).abs().max()) > tolerance * launches.split_k:
        raise AssertionError(f"stream_fixup's output is off by {float((got - want.sum(dim=0)).abs().max())}")


def resident_programs(usage: dict, num_warps: int, device: torch.device) -> int | None:
    """Programs of a kernel an SM holds at once, by registers, shared memory and threads (the
    occupancy calculator's rules: registers allocated per warp in 256s, 1 KiB of shared memory
    reserved per block); None off CUDA or when torch does not report the SM's limits."""
    if device.type != "cuda" or not usage:
        return None
    props = torch.cuda.get_device_properties(device)
    registers = getattr(props, "regs_per_multiprocessor", None)
    shared = getattr(props, "shared_memory_per_multiprocessor", None)
    threads = getattr(props, "max_threads_per_multi_processor", None)
    if not (registers and shared and threads):
        return None
    per_warp = -(-max(1, usage["registers"]) * 32 // 256) * 256
    return min(registers // (per_warp * num_warps), shared // (usage["shared_bytes"] + 1024),
               threads // (32 * num_warps))


def anatomy_rows(problems: dict, device: torch.device, timer, check) -> list[dict]:
    """One row per weight shape at M = 1: the ms of each part-kernel, the kernel and bf16 (or
    the error that stopped the shape: the anatomy is a diagnosis, it never stops a run)."""
    from dataclasses import asdict

    from kvdeck.kernels.triton import w4a16_marlin as marlin

    rows = []
    for problem in problems.values():
        x, reference = problem.input(M)
        config = marlin.config_for(M, problem.n, problem.k, problem.group, device)
        row = {"kind": "anatomy", "m": M, "k": problem.k, "n": problem.n, "config": asdict(config)}
        try:
            row.update(_timed(problem, x, reference, config, timer, check))
        except Exception as exc:  # noqa: BLE001  (a refused launch, a wrong part-kernel)
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    return rows


def _timed(problem, x: torch.Tensor, reference: torch.Tensor, config, timer, check) -> dict:
    from kvdeck.kernels.triton import w4a16_marlin as marlin

    parts = Launches(x, problem.repacked, config)
    check_launches(parts)
    kernel = lambda: marlin.w4a16_matmul_marlin(x, problem.repacked, config=config)  # noqa: E731
    check(f"anatomy marlin k={problem.k} n={problem.n}", kernel(), reference)
    dense_bf16, x_bf16 = problem.dense.to(torch.bfloat16), x.to(torch.bfloat16)
    parts.empty()
    ms = timer({
        "bf16": lambda: x_bf16 @ dense_bf16,
        "launch": parts.empty,
        "stream": parts.stream,
        "stream_deep": lambda: parts.stream(num_stages=DEEP_STAGES),
        "stream_fixup": lambda: parts.stream(fixup=True),
        "marlin": kernel,
    })
    w = problem.repacked
    weight_bytes = sum(t.numel() * t.element_size() for t in (w.qweight, w.scales, w.zeros))
    usage = dict(parts.usage)
    resident = {name: resident_programs(u, config.num_warps, x.device) for name, u in usage.items()}
    return {"split": parts.split_k, "programs": parts.grid[0] * parts.grid[1] * parts.grid[2],
            "ms": ms, "weight_bytes": weight_bytes,
            "stream_tb_s": weight_bytes / (ms["stream"] * 1e-3) / 1e12,
            "usage": usage, "resident_programs_per_sm": resident}


def describe(row: dict) -> str:
    """One printed line: each part's microseconds."""
    head = f"anatomy M={row['m']} K={row['k']} N={row['n']}"
    if "error" in row:
        return f"{head}: {row['error']}"
    parts = "  ".join(f"{name} {ms * 1e3:6.1f} us" for name, ms in row["ms"].items())
    return (f"{head} split {row['split']} ({row['programs']} programs): {parts}  "
            f"stream {row['stream_tb_s']:.2f} TB/s")
