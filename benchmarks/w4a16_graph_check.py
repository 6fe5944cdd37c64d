"""The W4A16 GEMM captured in CUDA graphs (bench_w4a16.py --check-graphs, the battery's check
stage): what AWQ layers run (with KVDECK_W4A16_KERNEL=marlin, the repacked kernel) at every
batch size the engine captures for decode, replayed on new inputs against eager calls, then
the repacked kernel's GEMV form at M = 1, 2, 4 against eager calls and the dense product, and
the weight as a gate | up layer with the activation in the epilogue (paired columns) at decode
sizes, against eager calls and the unfused pair."""

import sys
from pathlib import Path

import torch

from kvdeck.kernels.dispatch import w4a16_gemm
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from w4a16_problem import GROUP, SHAPES, checker, random_awq  # noqa: E402


def check_graphs(smoke: bool = False) -> None:
    """Capture w4a16_gemm (what AWQ layers run; with KVDECK_W4A16_KERNEL=marlin, the repacked
    kernel) in a CUDA graph at every batch size the
    engine captures for decode, replay it on new inputs and compare with eager calls. --smoke
    (the CPU): a few sizes, tiny shapes, the "replay" an eager call on the same buffers."""
    from kvdeck.engine.runner.decode_graphs import MAX_CAPTURED_BATCH, decode_bucket_sizes

    k, n = (256, 128) if smoke else SHAPES[0]
    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.float16)
    qweight, qzeros, scales = random_awq(k, n, device, dtype)
    from kvdeck.kernels.dispatch import w4a16_kernel

    gemm = w4a16_gemm
    if w4a16_kernel() == "marlin":  # KVDECK_W4A16_KERNEL=marlin: the repacked kernel's graphs
        from kvdeck.kernels.reference.w4a16_repack import repack_awq
        from kvdeck.kernels.triton.w4a16_marlin import w4a16_gemm_marlin

        repacked = repack_awq(qweight, qzeros, scales, GROUP)
        gemm = lambda x, *_: w4a16_gemm_marlin(x, repacked)  # noqa: E731
    for m in decode_bucket_sizes(4 if smoke else MAX_CAPTURED_BATCH):
        x = torch.randn(m, k, device=device, dtype=dtype)
        gemm(x, qweight, qzeros, scales, GROUP)  # compiles outside the capture
        if smoke:
            x.normal_()
            captured = gemm(x, qweight, qzeros, scales, GROUP)
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = gemm(x, qweight, qzeros, scales, GROUP)
            x.normal_()
            graph.replay()
        eager = gemm(x, qweight, qzeros, scales, GROUP)
        diff = float((captured.float() - eager.float()).abs().max())
        print(f"graph M={m:4d}: max |replay - eager| {diff:.3g}", flush=True)
        if diff > 1e-2 * float(eager.abs().max()):
            raise AssertionError(f"CUDA graph replay differs from eager at M={m}: {diff}")
    if w4a16_kernel() == "marlin":  # the GEMV form too, before any tuned table serves it
        _check_gemv_graphs(repacked, dequantize_awq(qweight, qzeros, scales, GROUP), smoke)
        _check_gated_graphs(repacked, dequantize_awq(qweight, qzeros, scales, GROUP), smoke)


def _replayed(call, x: torch.Tensor, smoke: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(what `call` gave captured in a CUDA graph and replayed after x was redrawn, an eager
    call's result on that x); --smoke (the CPU): the "replay" an eager call."""
    call()  # compiles outside the capture
    if smoke:
        captured = call()
    else:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call()
        x.normal_()
        graph.replay()
    return captured, call()


def _check_gemv_graphs(repacked, dense: torch.Tensor, smoke: bool) -> None:
    """The repacked kernel's GEMV form (its inline PTX on a GPU) at M = 1, 2 and 4: captured,
    replayed on new inputs, equal to eager calls and to the dense product."""
    from dataclasses import replace

    from kvdeck.kernels.triton import w4a16_marlin as marlin

    config = replace(marlin.GEMV_CONFIG, block_k=min(marlin.GEMV_CONFIG.block_k, GROUP), split_k=4)
    check = checker()
    for m in (1, 2, 4):
        x = torch.randn(m, dense.shape[0], device=dense.device, dtype=dense.dtype)
        gemv = lambda x=x: marlin.w4a16_matmul_marlin(x, repacked, config=config)  # noqa: E731
        captured, eager = _replayed(gemv, x, smoke)
        if not torch.equal(captured, eager):
            raise AssertionError(f"the GEMV form's graph replay differs from eager at M={m}")
        error = check(f"gemv M={m}", eager, (x.float() @ dense.float()).to(x.dtype))
        print(f"graph gemv M={m}: replay == eager, max |out - dense product| {error:.3g}", flush=True)



def _check_gated_graphs(repacked, dense: torch.Tensor, smoke: bool) -> None:
    """The weight as an MLP's gate | up layer, its columns paired and SiLU-and-mul applied in
    the GEMM's epilogue (KVDECK_FUSED_ACTIVATION's default): at M = 1, 4, 16 captured,
    replayed on new inputs, equal to eager calls and close to the activation of the dense
    product; whether it is bit for bit the unfused pair (the product, then the activation
    kernel) is printed (the engines' tokens are compared end to end by w4a16_e2e.py)."""
    from kvdeck.kernels.reference.activation import silu_and_mul_torch
    from kvdeck.kernels.reference.w4a16_repack import pair_halves
    from kvdeck.kernels.triton import w4a16_marlin as marlin
    from kvdeck.kernels.triton.activation import silu_and_mul_triton

    paired = pair_halves(repacked)
    check = checker()
    for m in (1, 4, 16):
        x = torch.randn(m, dense.shape[0], device=dense.device, dtype=dense.dtype)
        gated = lambda x=x: marlin.w4a16_gemm_marlin(x, paired, activation="silu")  # noqa: E731
        captured, eager = _replayed(gated, x, smoke)
        if not torch.equal(captured, eager):
            raise AssertionError(f"the gated GEMM's graph replay differs from eager at M={m}")
        unfused = silu_and_mul_triton(marlin.w4a16_gemm_marlin(x, repacked))
        error = check(f"gated M={m}", eager, silu_and_mul_torch((x.float() @ dense.float()).to(x.dtype)))
        print(f"graph gated M={m}: replay == eager, max |out - act(dense product)| {error:.3g}, "
              f"bit for bit the unfused pair: {torch.equal(eager, unfused)}", flush=True)
