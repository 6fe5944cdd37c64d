"""Where a decode-size launch of the repacked W4A16 kernel spends its time, without a profiler.

The kernel (kernels/triton/w4a16_marlin.py) at M = 1 under its config for the GPU, beside
kernels that do part of its work on the same grid, tiles, split and pipeline depth, all timed
side by side in CUDA graphs (w4a16_sweep.time_alternating) with bf16 cuBLAS:

  launch        the grid's programs start and return: the launch and scheduling floor
  stream        each program loads its x, packed-weight, zero and scale tiles as the kernel
                does (the same addresses and masks, pipelined num_stages deep) and folds
                them with an instruction or two an element: the memory floor of this
                decomposition (its K step is about 110 instructions a thread on sm_90
                against the kernel's 294, the address arithmetic and copies being common)
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
part-kernel's result is checked against the same fold in torch before it is timed (exact in
its bits, to fp32's rounding in its sums), so a wrong one fails.
"""

import itertools

import torch
import triton
import triton.language as tl

from kvdeck.kernels.reference.w4a16_repack import TILE_N, RepackedW4
from kvdeck.kernels.triton.launch import jit, launch
from kvdeck.kernels.triton.loop_bounds import scalar
from kvdeck.kernels.triton.w4a16_gemm import SplitLaunch, _finish_tile
from kvdeck.kernels.triton.w4a16_layout import load_group, load_words, packed_columns

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
    TILE: tl.constexpr, SPLIT_K: tl.constexpr, FIXUP: tl.constexpr, STAGES: tl.constexpr,
):
    """The repacked kernel's loads (its grid, tiles and addresses), folded with one or two
    instructions an element: packed words and zeros XORed, x and scales summed. The loop asks
    for STAGES stages itself (`tl.range`): Triton pipelines a loop's loads through cp.async
    unasked only when they feed a dot. Each program's fold, as an fp32 value, goes to every
    element of its slot of `partial` (FIXUP: through the kernel's split-K epilogue into `out`)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    columns = packed_columns(offs_n, stride_qwt, TILE)
    words = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.int32)
    zero_bits = tl.zeros((BLOCK_N,), dtype=tl.int32)
    x_sum = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    scale_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in tl.range(scalar(k_start), scalar(k_end), BLOCK_K, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=mask_m[:, None], other=0.0)
        packed = load_words(qw_ptr, k0 // 8 + tl.arange(0, BLOCK_K // 8), columns, mask_n, TILE)
        z, scale = load_group(z_ptr, s_ptr, k0 // GROUP_SIZE, offs_n, mask_n, stride_zg, stride_sg, True,
                              BLOCK_N)
        words ^= packed
        zero_bits ^= z
        x_sum += x.to(tl.float32)
        scale_sum += scale.to(tl.float32)
    # 8 bits of the XORs, so the fold is an fp32 integer plus the sums, exact enough to check.
    word = tl.xor_sum(tl.xor_sum(words, axis=1), axis=0) ^ tl.xor_sum(zero_bits, axis=0)
    fold = (word & 0xFF).to(tl.float32) + tl.sum(tl.sum(x_sum, axis=1), axis=0) + tl.sum(scale_sum, axis=0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + fold
    if FIXUP:
        _finish_tile(acc, out_ptr, out_ptr, partial_ptr, counter_ptr, M, N, offs_m, offs_n, mask_m,
                     mask_n, stride_om, pid_m, pid_n, pid_k, split_k, BLOCK_M, BLOCK_N, False, SPLIT_K,
                     False, -1)
    else:
        tl.store(partial_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :], acc,
                 mask=mask_m[:, None] & mask_n[None, :])


class Launches:
    """The part-kernels of one (x, weight, config) launch, shaped as w4a16_matmul_marlin shapes
    it; each keeps its compiled kernel's registers and shared memory (on a GPU)."""

    def __init__(self, x: torch.Tensor, w: RepackedW4, config) -> None:
        self.x, self.w, self.config = x, w, config
        m, k = x.shape
        self.out = torch.empty((m, w.n), dtype=torch.float32, device=x.device)
        self.split = split = SplitLaunch.make(self.out, k, config.block_m, config.block_n, config.block_k,
                                              config.split_k)
        self.k_per_split, self.split_k, self.grid = split.k_per_split, split.split_k, split.grid
        # `stream` writes every split's fold here (no epilogue): its own buffer, never the counters'.
        self.partial = torch.empty((self.split_k, m, w.n), dtype=torch.float32, device=x.device)
        self.usage: dict[str, dict] = {}

    def empty(self) -> None:
        self._record("launch", launch(_launch_floor_kernel, self.grid, self.out))

    def stream(self, fixup: bool = False, num_stages: int | None = None) -> torch.Tensor:
        """The loads and folded product: each split's product in `partial` [split, M, N], or
        (fixup) their sum through the split-K epilogue in `out` [M, N]."""
        x, w, cfg = self.x, self.w, self.config
        if w.zeros is None:
            raise ValueError("the anatomy streams an asymmetric (AWQ) weight: it has zeros")
        zeros = w.zeros
        compiled = launch(
            _stream_kernel, self.grid,
            x, w.qweight, zeros, w.scales, self.out,
            self.split.partial if fixup else self.partial, self.split.counters,
            x.shape[0], w.n, w.k, self.k_per_split, self.split_k,
            x.stride(0), x.stride(1), w.qweight.stride(0), zeros.stride(0), w.scales.stride(0),
            self.out.stride(0),
            GROUP_SIZE=w.group_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            TILE=TILE_N, SPLIT_K=self.split_k > 1, FIXUP=fixup, STAGES=num_stages or cfg.num_stages,
            num_warps=cfg.num_warps)
        name = "stream_fixup" if fixup else "stream" if num_stages is None else "stream_deep"
        self._record(name, compiled)
        return self.out if fixup else self.partial

    def _record(self, name: str, compiled) -> None:
        if name not in self.usage and getattr(compiled, "n_regs", None) is not None:
            self.usage[name] = {"registers": compiled.n_regs, "shared_bytes": compiled.metadata.shared}


def _xor_all(values: torch.Tensor) -> int:
    """The XOR of every element (int32), by halving."""
    values = values.flatten()
    while values.numel() > 1:
        if values.numel() % 2:
            values = torch.cat([values, values.new_zeros(1)])
        values = values[0::2] ^ values[1::2]
    return int(values[0]) if values.numel() else 0


def folds(launches: Launches) -> torch.Tensor:
    """What `_stream_kernel` folds per program, in torch: [grid_m, grid_n, split] float64, the
    low 8 bits of its packed words' and zeros' XOR plus the sum of its x and scale tiles."""
    x, w, cfg = launches.x, launches.w, launches.config
    (grid_m, grid_n, splits), m, k = launches.grid, x.shape[0], x.shape[1]
    words = w.qweight.permute(1, 0, 2).reshape(k // 8, -1).cpu()  # word (p, n), padded columns
    zeros, scales, xs = w.zeros.cpu().to(torch.int32), w.scales.double().cpu(), x.double().cpu()
    result = torch.zeros(grid_m, grid_n, splits, dtype=torch.float64)
    for pid_m, pid_n, pid_k in itertools.product(range(grid_m), range(grid_n), range(splits)):
        rows = slice(pid_m * cfg.block_m, min(m, (pid_m + 1) * cfg.block_m))
        cols = slice(pid_n * cfg.block_n, min(w.n, (pid_n + 1) * cfg.block_n))
        bits, total = 0, 0.0
        k_end = min(k, (pid_k + 1) * launches.k_per_split)
        for k0 in range(pid_k * launches.k_per_split, k_end, cfg.block_k):
            group = k0 // w.group_size
            bits ^= _xor_all(words[k0 // 8:(k0 + cfg.block_k) // 8, cols]) ^ _xor_all(zeros[group, cols])
            total += float(xs[rows, k0:k0 + cfg.block_k].sum()) + float(scales[group, cols].sum())
        result[pid_m, pid_n, pid_k] = (bits & 0xFF) + total
    return result


def check_launches(launches: Launches) -> None:
    """Raise unless the part-kernels wrote what torch says they should: each program's fold in
    its output tile (through the epilogue, a tile's folds summed over its splits)."""
    cfg, splits = launches.config, launches.split_k
    m, n = launches.x.shape[0], launches.w.n
    want = folds(launches)
    tolerance = 1e-3 * float(want.abs().max()) + 1e-3

    def tiles(per_tile: torch.Tensor) -> torch.Tensor:  # [grid_m, grid_n] -> [M, N]
        return per_tile.repeat_interleave(cfg.block_m, 0).repeat_interleave(cfg.block_n, 1)[:m, :n]

    got = launches.stream().double().cpu()
    for split in range(splits):
        error = float((got[split] - tiles(want[:, :, split])).abs().max())
        if error > tolerance:
            raise AssertionError(f"the stream kernel's fold is off by {error} in split {split}")
    got = launches.stream(fixup=True).double().cpu()
    error = float((got - tiles(want.sum(dim=2))).abs().max())
    if error > tolerance * splits:
        raise AssertionError(f"stream_fixup's output is off by {error}")


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
