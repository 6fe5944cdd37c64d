"""What the AOT matrix compiles (benchmarks/compile_for_gpu.py): every Triton kernel variant
as its wrapper specialises it on CUDA (dtypes, padded head dims, GQA groups, split counts,
W4A16 M buckets and groups, LoRA's launch forms), each with its constexprs, pointer types and
launch options, and the architectures with their shared-memory limits. Building a variant
compiles nothing; compile_for_gpu.py lowers them.
"""

import dataclasses
import os
from dataclasses import dataclass

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when it is unset

import torch  # noqa: E402
import triton  # noqa: E402

from kvdeck.kernels.triton import activation as activation_triton  # noqa: E402
from kvdeck.kernels.triton import attention as attention_triton  # noqa: E402
from kvdeck.kernels.triton import (
    attention_tuning,  # noqa: E402
    lora_grouped,  # noqa: E402
)
from kvdeck.kernels.triton import int8_head as int8_head_triton  # noqa: E402
from kvdeck.kernels.triton import kv_cache as kv_cache_triton  # noqa: E402
from kvdeck.kernels.triton import kv_quant as kv_quant_triton  # noqa: E402
from kvdeck.kernels.triton import lora as lora_triton  # noqa: E402
from kvdeck.kernels.triton import qk_norm_rope_kv as qk_norm_rope_kv_triton  # noqa: E402
from kvdeck.kernels.triton import rmsnorm as rmsnorm_triton  # noqa: E402
from kvdeck.kernels.triton import rope as rope_triton  # noqa: E402
from kvdeck.kernels.triton import w4a16_gemm as w4a16_gemm_triton  # noqa: E402
from kvdeck.kernels.triton import w4a16_gemv as w4a16_gemv_triton  # noqa: E402
from kvdeck.kernels.triton import w4a16_marlin as w4a16_marlin_triton  # noqa: E402
from kvdeck.kernels.triton.elementwise_tiling import num_warps_for, rows_per_program  # noqa: E402
from kvdeck.kernels.triton.lora_plan import GROUP_ROWS, LoRAKernelConfig, lora_kernel_config  # noqa: E402

# Opt-in shared memory per block (CUDA reserves 1 KB of the SM's carveout per block):
# A100 163 KB, RTX 30xx/A10 (sm_86) and RTX 40xx/L4 (sm_89) 99 KB, H100/H200 227 KB.
# NVIDIA's Ampere, Ada and Hopper tuning guides, "Occupancy" / "Unified Shared Memory".
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
ARCHS = tuple(SHARED_MEMORY_LIMIT)
ATTENTION_DTYPES = ("fp16", "bf16")
ATTENTION_HEAD_DIMS = (64, 128, 256)
ATTENTION_GROUPS = (1, 4, 8)
# fp16 and bf16 attention lower to the same tiles: all 84 fp16 rows of the full grid had their
# bf16 twin's shared memory, registers and spills, under triton 3.6 and 3.9 alike. So bf16
# takes every head dim and group, fp16 head dim 128 at group 4 (the specials below add padded
# dims, 8-bit caches and windows in fp16), which keeps the matrix's CI time (attention was
# three quarters of its compile time).
ATTENTION_FP16_HEAD_DIMS = (128,)
ATTENTION_FP16_GROUPS = (4,)
W4A16_DTYPES = ("fp16", "bf16")


@dataclass(frozen=True, slots=True)
class Variant:
    fn: object  # a triton JITFunction
    pointer_types: dict[str, str]
    constexprs: dict[str, object]
    options: dict[str, int]
    decode: bool  # launched by every decode step: must not spill registers
    on_arch: dict | None = None  # SM version -> the Variant that arch builds instead (its tiles)

    def for_arch(self, arch: int) -> "Variant":
        return (self.on_arch or {}).get(arch, self)


def gpu_rows(row_elements: int) -> int:
    return rows_per_program(row_elements, torch.device("cuda"))


# KV cache storage per kv_cache_dtype: (pointer type, FP8_MANT, per-(token, head) scales).
KV_STORAGE = {"auto": (None, 0, False), "fp8_e4m3": ("*u8", 3, False),
              "fp8_e5m2": ("*u8", 2, False), "int8": ("*i8", 0, True)}


def attention_variant(dtype: str, head_dim: int, group: int, decode: bool, segments: int,
                      kv: str = "auto", sliding: bool = False, soft_cap: bool = False,
                      wide: bool = False) -> Variant:
    """The launch on every arch but Hopper, with Hopper's own where its tiles differ. `wide`:
    a cache of 2^31 elements or more (64-bit offsets); launches on smaller ones are not."""
    args = (dtype, head_dim, group, decode, segments, kv, sliding, soft_cap, wide)
    variant, hopper = _attention_variant(*args, arch=ARCHS[0]), _attention_variant(*args, arch=90)
    return variant if hopper == variant else dataclasses.replace(variant, on_arch={90: hopper})


def _attention_variant(dtype: str, head_dim: int, group: int, decode: bool, segments: int,
                       kv: str, sliding: bool, soft_cap: bool, wide: bool, arch: int) -> Variant:
    f32 = dtype == "fp32"
    cache_type, fp8_mantissa, token_scales = KV_STORAGE[kv]
    config = attention_tuning.default_config(1 if decode else 16, head_dim, torch.device("cuda"),
                                             element_size=4 if f32 else 2 if kv == "auto" else 1,
                                             arch=arch)
    block_m = max(config.block_m, triton.next_power_of_2(group))
    cache_type = cache_type or f"*{dtype}"
    return Variant(
        attention_triton._paged_attention_kernel,
        dict(out_ptr=f"*{dtype}", q_ptr=f"*{dtype}", k_cache_ptr=cache_type,
             v_cache_ptr=cache_type, block_tables_ptr="*i32", query_start_loc_ptr="*i32",
             seq_lens_ptr="*i32", part_out_ptr="*fp32", part_max_ptr="*fp32",
             part_sum_ptr="*fp32", k_scales_ptr="*fp16", v_scales_ptr="*fp16",
             qk_scale="fp32", v_mult="fp32", soft_cap="fp32"),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
             BLOCK_SIZE=16, GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_m // group,
             TILE_N=config.tile_n, NUM_SEGMENTS=segments, COMPUTE_F32=f32,
             DOT_PRECISION="ieee" if f32 else "tf32", DECODE_ROWS=decode, SLIDING=sliding,
             SOFT_CAP=soft_cap, FP8_MANT=fp8_mantissa, TOKEN_SCALES=token_scales,
             WIDE_OFFSETS=wide),
        dict(num_warps=config.num_warps, num_stages=config.num_stages),
        decode=decode,
    )


def w4a16_variant(dtype: str, max_tokens: int, group_size: int, split: bool) -> Variant:
    # The bucket's tiles as `choose_config` fits them to the group (split count is runtime).
    config = w4a16_gemm_triton.choose_config(max_tokens, 4096, 4096, group_size, num_sms=132)
    return Variant(
        w4a16_gemm_triton._w4a16_gemm_kernel,
        dict(x_ptr=f"*{dtype}", qw_ptr="*i32", qz_ptr="*i32", s_ptr=f"*{dtype}",
             bias_ptr=f"*{dtype}", out_ptr=f"*{dtype}", partial_ptr="*fp32", counter_ptr="*i32"),
        # stride_xk is 1 for contiguous activations, which the launcher specialises on.
        dict(GROUP_SIZE=group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
             BLOCK_K=config.block_k, HAS_BIAS=True, SPLIT_K=split, stride_xk=1),
        dict(num_warps=config.num_warps, num_stages=config.num_stages),
        decode=True,
    )


def w4a16_marlin_variant(dtype: str, max_tokens: int, group_size: int, split: bool,
                         zeros: bool = True, broadcast: bool = False, lop3: bool = True,
                         swap: bool = False, act: int | None = None) -> Variant:
    """The repacked-layout GEMM (kernels/triton/w4a16_marlin.py), its bucket's tiles (or the
    broadcast-load unpacking's), dequantising by the lop3 PTX as CUDA launches do (`lop3`
    False: the plain-Triton path the interpreter tests). An arch with a swept table
    (kernels/triton/w4a16_marlin_tuned.py) builds its own tiles where they differ. `act`: a
    gate | up layer's paired columns, stored in the layer's order (NO_ACTIVATION) or through
    the fused gated activation of that code."""
    args = (dtype, max_tokens, group_size, split, zeros, broadcast, lop3, swap, act)
    default = _w4a16_marlin_variant(*args, arch=None)
    tuned = {arch: own for arch in ARCHS if (own := _w4a16_marlin_variant(*args, arch=arch)) != default}
    return dataclasses.replace(default, on_arch=tuned or None)


def _w4a16_marlin_variant(dtype: str, max_tokens: int, group_size: int, split: bool, zeros: bool,
                          broadcast: bool, lop3: bool, swap: bool, act: int | None,
                          arch: int | None) -> Variant:
    config = w4a16_marlin_triton.choose_config(max_tokens, 4096, 4096, group_size, num_sms=132, arch=arch)
    if broadcast:
        config = w4a16_marlin_triton.BROADCAST_CONFIG
    if swap:
        config = w4a16_marlin_triton.SWAP_CONFIG
    return Variant(
        w4a16_marlin_triton._w4a16_marlin_kernel,
        dict(x_ptr=f"*{dtype}", qw_ptr="*i32", z_ptr="*u8", s_ptr=f"*{dtype}",
             bias_ptr=f"*{dtype}", out_ptr=f"*{dtype}", partial_ptr="*fp32", counter_ptr="*i32"),
        dict(GROUP_SIZE=group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
             BLOCK_K=config.block_k, TILE=w4a16_marlin_triton.TILE_N, HAS_ZEROS=zeros,
             HAS_BIAS=act is None, SPLIT_K=split, BROADCAST_LOAD=config.broadcast_load,
             LOP3=lop3 and not config.broadcast_load, SWAP_AB=config.swap_ab, stride_xk=1,
             **_paired(act)),
        dict(num_warps=config.num_warps, num_stages=config.num_stages),
        decode=True,
    )


def _paired(act: int | None) -> dict:
    """The constexprs of a paired gate | up layer's launch (none for a plain layer's)."""
    return {} if act is None else dict(PAIRED=True, ACT=act)


def w4a16_gemv_variant(dtype: str, group_size: int, split: bool, zeros: bool = True,
                       lop3: bool = True, act: int | None = None) -> Variant:
    """The GEMV form (kernels/triton/w4a16_gemv.py) under its default config (GEMV_CONFIG)
    fitted to the group; a tuned table's own GEMV config where it differs. `act` as for
    `w4a16_marlin_variant`."""
    def build(arch: int | None) -> Variant:
        config = w4a16_marlin_triton.tuning(arch).gemv
        return Variant(
            w4a16_gemv_triton._w4a16_gemv_kernel,
            dict(x_ptr=f"*{dtype}", qw_ptr="*i32", z_ptr="*u8", s_ptr=f"*{dtype}",
                 bias_ptr=f"*{dtype}", out_ptr=f"*{dtype}", partial_ptr="*fp32", counter_ptr="*i32"),
            dict(GROUP_SIZE=group_size, BLOCK_N=config.block_n, BLOCK_K=min(config.block_k, group_size),
                 TILE=w4a16_marlin_triton.TILE_N, HAS_ZEROS=zeros, HAS_BIAS=act is None, SPLIT_K=split,
                 LOP3=lop3, STAGES=config.num_stages, **_paired(act)),
            dict(num_warps=config.num_warps),
            decode=True,
        )
    default = build(None)
    tuned = {arch: own for arch in ARCHS if (own := build(arch)) != default}
    return dataclasses.replace(default, on_arch=tuned or None)


def w4a16_marlin_variants() -> dict[str, Variant]:
    """Every M bucket at group 128 (split and not, AWQ zeros), GPTQ's symmetric form and
    groups of 32 and 64 at the decode bucket, the broadcast-load unpacking, the dequantise; all
    with the lop3 PTX but the `_plain` ones (the plain-Triton dequantisation, decode bucket)."""
    variants = {}
    for dtype in W4A16_DTYPES:
        for max_tokens, _ in w4a16_marlin_triton.M_BUCKETS:
            for split in (False, True):
                name = f"w4a16_marlin_m{max_tokens}_{dtype}_g128" + ("_splitk" if split else "")
                variants[name] = w4a16_marlin_variant(dtype, max_tokens, 128, split)
        for group in (32, 64):
            variants[f"w4a16_marlin_m16_{dtype}_g{group}_splitk"] = w4a16_marlin_variant(
                dtype, 16, group, True)
        variants[f"w4a16_marlin_m16_{dtype}_g128_sym_splitk"] = w4a16_marlin_variant(
            dtype, 16, 128, True, zeros=False)
        variants[f"w4a16_marlin_m16_{dtype}_g128_broadcast_splitk"] = w4a16_marlin_variant(
            dtype, 16, 128, True, broadcast=True)
        variants[f"w4a16_marlin_m16_{dtype}_g128_plain_splitk"] = w4a16_marlin_variant(
            dtype, 16, 128, True, lop3=False)
        variants[f"w4a16_marlin_m16_{dtype}_g128_swap_splitk"] = w4a16_marlin_variant(
            dtype, 16, 128, True, swap=True)
        # The GEMV form for the smallest batches: AWQ at groups 128 and 32, GPTQ's symmetric.
        variants[f"w4a16_marlin_gemv_{dtype}_g128_splitk"] = w4a16_gemv_variant(dtype, 128, True)
        variants[f"w4a16_marlin_gemv_{dtype}_g32_splitk"] = w4a16_gemv_variant(dtype, 32, True)
        variants[f"w4a16_marlin_gemv_{dtype}_g128_sym_splitk"] = w4a16_gemv_variant(dtype, 128, True,
                                                                                     zeros=False)
        # A gate | up layer's paired columns: the MLP's activation in the epilogue (SiLU; GeGLU's
        # GELU in bf16, Gemma's dtype), and the layer's order stored back without one.
        variants[f"w4a16_marlin_m16_{dtype}_g128_silu_splitk"] = w4a16_marlin_variant(
            dtype, 16, 128, True, act=activation_triton.SILU)
        variants[f"w4a16_marlin_m16_{dtype}_g128_silu"] = w4a16_marlin_variant(
            dtype, 16, 128, False, act=activation_triton.SILU)
        variants[f"w4a16_marlin_m16_{dtype}_g128_paired_splitk"] = w4a16_marlin_variant(
            dtype, 16, 128, True, act=activation_triton.NO_ACTIVATION)
        variants[f"w4a16_marlin_gemv_{dtype}_g128_silu_splitk"] = w4a16_gemv_variant(
            dtype, 128, True, act=activation_triton.SILU)
        if dtype == "bf16":
            variants[f"w4a16_marlin_m16_{dtype}_g128_gelu_splitk"] = w4a16_marlin_variant(
                dtype, 16, 128, True, act=activation_triton.GELU_TANH)
        variants[f"marlin_dequantize_{dtype}"] = Variant(
            w4a16_marlin_triton._marlin_dequantize_kernel,
            dict(qw_ptr="*i32", z_ptr="*u8", s_ptr=f"*{dtype}", out_ptr=f"*{dtype}"),
            dict(GROUP_SIZE=128, BLOCK_K=w4a16_marlin_triton.DEQUANT_BLOCK_K,
                 BLOCK_N=w4a16_marlin_triton.DEQUANT_BLOCK_N, TILE=w4a16_marlin_triton.TILE_N,
                 HAS_ZEROS=True, LOP3=True),
            dict(num_warps=4), decode=True,  # decode batches above FUSED_MAX_TOKENS
        )
        paired_dequantize = variants[f"marlin_dequantize_{dtype}"]
        variants[f"marlin_dequantize_{dtype}_paired"] = dataclasses.replace(
            paired_dequantize, constexprs={**paired_dequantize.constexprs, "PAIRED": True})
    return variants


def qk_norm_rope_kv_variant(dtype: str, head_dim: int, rotary_dim: int, norm: bool,
                            is_neox: bool) -> Variant:
    """The fused q/k RMSNorm + RoPE + KV write (kernels/triton/qk_norm_rope_kv.py)."""
    pad, half = triton.next_power_of_2(head_dim), rotary_dim // 2
    return Variant(
        qk_norm_rope_kv_triton._qk_norm_rope_kv_kernel,
        dict(q_ptr=f"*{dtype}", k_ptr=f"*{dtype}", v_ptr=f"*{dtype}", q_weight_ptr=f"*{dtype}",
             k_weight_ptr=f"*{dtype}", positions_ptr="*i64", cos_sin_ptr="*fp32",
             slot_mapping_ptr="*i64", k_cache_ptr=f"*{dtype}", v_cache_ptr=f"*{dtype}",
             eps="fp32"),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=pad, HALF=half, HALF_PAD=triton.next_power_of_2(half),
             TAIL_PAD=triton.next_power_of_2(max(head_dim - rotary_dim, 1)), HAS_NORM=norm,
             IS_NEOX=is_neox, BLOCK_SIZE=16, ROWS=gpu_rows(pad)),
        dict(num_warps=num_warps_for(gpu_rows(pad) * pad)), decode=True,
    )


def qk_norm_rope_kv_variants() -> dict[str, Variant]:
    """Qwen3 (per-head norms, d128), Llama without norms (d64, d128) in both dtypes, and a
    partial interleaved rotary on a padded head dim."""
    variants = {}
    for dtype in ("fp16", "bf16"):
        variants[f"qk_norm_rope_kv_{dtype}_d128"] = qk_norm_rope_kv_variant(dtype, 128, 128, True, True)
        for head_dim in (64, 128):
            variants[f"qk_rope_kv_no_norm_{dtype}_d{head_dim}"] = qk_norm_rope_kv_variant(
                dtype, head_dim, head_dim, False, True)
    variants["qk_norm_rope_kv_interleaved_partial_fp16_d80"] = qk_norm_rope_kv_variant(
        "fp16", 80, 48, True, False)
    return variants


def lora_variants() -> dict[str, Variant]:
    """The LoRA kernels (kernels/triton/lora.py) in both launch forms: eager steps (a list of
    adapter rows, the step's largest rank) and the adapter decode graphs (every row, captured
    at max_lora_rank 64, each slot's rank read from device memory); each arch under the launch
    config it serves (kernels/triton/lora_plan.py), and the one-launch form of it."""
    variants = {}
    forms = (("rows_r16", True, False, 16), ("graph_r64", False, True, 64))
    for dtype in ("fp16", "bf16"):
        for form, has_rows, has_ranks, rank in forms:
            for kernel in ("shrink", "expand", "fused"):
                built = {arch: _lora_variant(kernel, dtype, has_rows, has_ranks, rank,
                                             lora_kernel_config(arch)) for arch in ARCHS}
                differing = {arch: v for arch, v in built.items() if v != built[ARCHS[0]]}
                variants[f"lora_{kernel}_{dtype}_{form}"] = dataclasses.replace(
                    built[ARCHS[0]], on_arch=differing or None)
    return variants


def _lora_variant(kernel: str, dtype: str, has_rows: bool, has_ranks: bool, rank: int,
                  config: LoRAKernelConfig) -> Variant:
    ranks = "*i32" if has_ranks else "*i64"  # without ranks the launch passes the slots
    block_r = triton.next_power_of_2(rank)
    flags = dict(HAS_ROWS=has_rows, HAS_RANKS=has_ranks, BLOCK_R=block_r)
    rows = dict(rows_ptr="*i64", slots_ptr="*i64", ranks_ptr=ranks)
    block_n = lora_triton.expand_block_n(block_r, config)
    if kernel == "shrink":
        fn = lora_triton._lora_shrink_kernel
        pointers = dict(x_ptr=f"*{dtype}", a_ptr=f"*{dtype}", **rows, h_ptr="*fp32")
        flags.update(BLOCK_K=lora_triton.shrink_block_k(block_r, config.split_k), SPLIT_K=config.split_k)
    elif kernel == "expand":
        fn = lora_triton._lora_expand_kernel
        pointers = dict(h_ptr="*fp32", b_ptr=f"*{dtype}", **rows, out_ptr=f"*{dtype}", offsets_ptr="*i32",
                        sizes_ptr="*i32")
        # The partials of a 4096-input row (Llama-3-8B's hidden size) under the arch's split.
        flags.update(BLOCK_N=block_n, SPLITS=triton.next_power_of_2(config.num_splits(4096)))
    else:
        fn = lora_triton._lora_fused_kernel
        pointers = dict(x_ptr=f"*{dtype}", a_ptr=f"*{dtype}", b_ptr=f"*{dtype}", **rows, out_ptr=f"*{dtype}",
                        offsets_ptr="*i32", sizes_ptr="*i32")
        block_k = lora_triton.fused_block_k(block_r, config)
        flags.update(BLOCK_K=block_k, CHUNK=lora_triton.fused_chunk(block_k, config), BLOCK_N=block_n)
    return Variant(fn, pointers, flags, dict(num_warps=config.num_warps), decode=True)


def lora_grouped_variants() -> dict[str, Variant]:
    """The grouped LoRA kernels (kernels/triton/lora_grouped.py, tiles of one adapter's rows)
    as the adapter decode graphs launch them (each slot's rank read, max_lora_rank 16 and 64),
    under the sweep's first grouped split and block in each launch form."""
    variants = {}
    config = LoRAKernelConfig(split_k=256, block_n=128, grouped=True)
    for dtype in ("fp16", "bf16"):
        for rank in (16, 64):
            for kernel in ("shrink", "expand", "fused"):
                variants[f"lora_grouped_{kernel}_{dtype}_r{rank}"] = _lora_grouped_variant(
                    kernel, dtype, rank, dataclasses.replace(config, fused=kernel == "fused"))
    return variants


def _lora_grouped_variant(kernel: str, dtype: str, rank: int, config: LoRAKernelConfig) -> Variant:
    block_r = lora_grouped.grouped_block_r(rank)
    flags = dict(BLOCK_M=GROUP_ROWS, BLOCK_R=block_r)
    dots = dict(DOT_F32=False, DOT_PRECISION="tf32")
    tiles = dict(tiles_ptr="*i32", rows_ptr="*i32", ranks_ptr="*i32")
    outputs = dict(out_ptr=f"*{dtype}", offsets_ptr="*i32", sizes_ptr="*i32")
    block_n = lora_triton.expand_block_n(block_r, config)
    if kernel == "shrink":
        fn = lora_grouped._grouped_shrink_kernel
        pointers = dict(x_ptr=f"*{dtype}", a_ptr=f"*{dtype}", **tiles, h_ptr="*fp32")
        flags.update(BLOCK_K=lora_grouped.grouped_block_k(block_r, config.split_k), SPLIT_K=config.split_k,
                     **dots)
    elif kernel == "expand":
        fn = lora_grouped._grouped_expand_kernel
        pointers = dict(h_ptr="*fp32", b_ptr=f"*{dtype}", **tiles, **outputs)
        flags.update(BLOCK_N=block_n)
    else:
        fn = lora_grouped._grouped_fused_kernel
        pointers = dict(x_ptr=f"*{dtype}", a_ptr=f"*{dtype}", b_ptr=f"*{dtype}", **tiles, **outputs)
        flags.update(BLOCK_K=lora_grouped.grouped_block_k(block_r, config.split_k, fused=True),
                     BLOCK_N=block_n, **dots)
    return Variant(fn, pointers, flags, dict(num_warps=config.num_warps), decode=True)


def build_variants() -> dict[str, Variant]:
    variants = {}
    for dtype in ATTENTION_DTYPES:
        for head_dim in ATTENTION_HEAD_DIMS if dtype == "bf16" else ATTENTION_FP16_HEAD_DIMS:
            for group in ATTENTION_GROUPS if dtype == "bf16" else ATTENTION_FP16_GROUPS:
                tag = f"{dtype}_d{head_dim}_g{group}"
                variants[f"attention_decode_{tag}"] = attention_variant(dtype, head_dim, group, True, 1)
                variants[f"attention_prefill_{tag}"] = attention_variant(dtype, head_dim, group, False, 1)
            # The flash-decoding split only changes the epilogue: one group per head dim.
            variants[f"attention_decode_split8_{dtype}_d{head_dim}_g4"] = attention_variant(
                dtype, head_dim, 4, True, 8)
    # Padded head dims and an fp32 model with a group that is not a power of two.
    variants["attention_prefill_fp16_d80_g1"] = attention_variant("fp16", 80, 1, False, 1)
    variants["attention_decode_split8_fp16_d96_g8"] = attention_variant("fp16", 96, 8, True, 8)
    variants["attention_decode_fp32_d128_g7"] = attention_variant("fp32", 128, 7, True, 1)
    # 8-bit caches (decoded as tiles load), sliding windows and Gemma 2's soft cap.
    for kv in ("fp8_e4m3", "fp8_e5m2", "int8"):
        variants[f"attention_decode_{kv}_bf16_d128_g4"] = attention_variant(
            "bf16", 128, 4, True, 1, kv=kv)
        variants[f"attention_prefill_{kv}_fp16_d128_g4"] = attention_variant(
            "fp16", 128, 4, False, 1, kv=kv)
    variants["attention_decode_sliding_softcap_bf16_d256_g2"] = attention_variant(
        "bf16", 256, 2, True, 1, sliding=True, soft_cap=True)
    variants["attention_prefill_sliding_bf16_d128_g4"] = attention_variant(
        "bf16", 128, 4, False, 1, sliding=True)
    variants["attention_decode_split8_sliding_int8_fp16_d128_g8"] = attention_variant(
        "fp16", 128, 8, True, 8, kv="int8", sliding=True)
    # A cache of 2^31 elements or more (64-bit offsets): the decode and prefill forms.
    for decode, form in ((True, "decode"), (False, "prefill")):
        variants[f"attention_{form}_wide_bf16_d128_g4"] = attention_variant(
            "bf16", 128, 4, decode, 1, wide=True)
    for head_dim in (80, 128, 256):
        variants[f"merge_segments_bf16_d{head_dim}"] = Variant(
            attention_triton._merge_segments_kernel,
            dict(out_ptr="*bf16", part_out_ptr="*fp32", part_max_ptr="*fp32", part_sum_ptr="*fp32"),
            dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim), NUM_SEGMENTS=8),
            dict(num_warps=4), decode=True,
        )
    for dtype in W4A16_DTYPES:
        for max_tokens, _ in w4a16_gemm_triton.M_BUCKETS:
            for split in (False, True):
                name = f"w4a16_m{max_tokens}_{dtype}_g128" + ("_splitk" if split else "")
                variants[name] = w4a16_variant(dtype, max_tokens, 128, split)
        # Groups of 32 narrow BLOCK_K to 32 (64 gives the tiles of 128).
        variants[f"w4a16_m16_{dtype}_g32_splitk"] = w4a16_variant(dtype, 16, 32, True)
        variants[f"awq_dequantize_{dtype}"] = Variant(
            w4a16_gemm_triton._awq_dequantize_kernel,
            dict(qw_ptr="*i32", qz_ptr="*i32", s_ptr=f"*{dtype}", out_ptr=f"*{dtype}"),
            dict(GROUP_SIZE=128, BLOCK_K=w4a16_gemm_triton.DEQUANT_BLOCK_K,
                 BLOCK_N=w4a16_gemm_triton.DEQUANT_BLOCK_N),
            dict(num_warps=4), decode=True,  # decode batches above FUSED_MAX_TOKENS
        )
    variants.update(w4a16_marlin_variants())
    variants["write_kv_cache_bf16"] = Variant(
        kv_cache_triton._write_kv_cache_kernel,
        dict(key_ptr="*bf16", value_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
             slot_mapping_ptr="*i64"),
        dict(HEAD_DIM=128, HEADS_PAD=8, HEAD_DIM_PAD=128, BLOCK_SIZE=16, ROWS=gpu_rows(8 * 128)),
        dict(num_warps=num_warps_for(gpu_rows(8 * 128) * 8 * 128)), decode=True,
    )
    for kv, (cache_type, mantissa, _) in KV_STORAGE.items():
        if kv == "auto":
            continue
        variants[f"write_kv_cache_{kv}_bf16"] = Variant(
            kv_quant_triton._write_kv_8bit_kernel,
            dict(key_ptr="*bf16", value_ptr="*bf16", k_cache_ptr=cache_type, v_cache_ptr=cache_type,
                 k_scales_ptr="*fp16", v_scales_ptr="*fp16", slot_mapping_ptr="*i64",
                 k_scale="fp32", v_scale="fp32"),
            dict(HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_SIZE=16, ROWS=gpu_rows(128),
                 FP8_MANT=mantissa, FP8_LIMIT=448.0 if mantissa == 3 else 57344.0 if mantissa else 127.0),
            dict(num_warps=num_warps_for(gpu_rows(128) * 128)), decode=True,
        )
    variants["rms_norm_residual_bf16_4096"] = Variant(
        rmsnorm_triton._rms_norm_kernel,
        dict(x_ptr="*bf16", residual_ptr="*bf16", weight_ptr="*bf16", out_ptr="*bf16",
             residual_out_ptr="*bf16", eps="fp32"),
        dict(HAS_RESIDUAL=True, ROWS=gpu_rows(4096), BLOCK=4096),
        dict(num_warps=num_warps_for(gpu_rows(4096) * 4096)), decode=True,
    )
    variants["rms_norm_per_head_fp16_fp32weight_128"] = Variant(
        rmsnorm_triton._rms_norm_kernel,
        dict(x_ptr="*fp16", residual_ptr="*fp16", weight_ptr="*fp32", out_ptr="*fp32",
             residual_out_ptr="*fp16", eps="fp32"),
        dict(HAS_RESIDUAL=False, ROWS=gpu_rows(128), BLOCK=128),
        dict(num_warps=num_warps_for(gpu_rows(128) * 128)), decode=True,
    )
    variants["rope_neox_bf16"] = Variant(
        rope_triton._rope_kernel,
        dict(positions_ptr="*i64", q_ptr="*bf16", k_ptr="*bf16", cos_sin_ptr="*fp32"),
        dict(HALF=64, HALF_PAD=64, ROWS=gpu_rows(64), IS_NEOX=True),
        dict(num_warps=num_warps_for(gpu_rows(64) * 64)), decode=True,
    )
    variants["rope_interleaved_partial_fp16"] = Variant(
        rope_triton._rope_kernel,
        dict(positions_ptr="*i32", q_ptr="*fp16", k_ptr="*fp16", cos_sin_ptr="*fp32"),
        dict(HALF=12, HALF_PAD=16, ROWS=gpu_rows(16), IS_NEOX=False),
        dict(num_warps=num_warps_for(gpu_rows(16) * 16)), decode=True,
    )
    variants.update(qk_norm_rope_kv_variants())
    variants.update(lora_variants())
    variants.update(lora_grouped_variants())
    for act, name in ((activation_triton.SILU, "silu"), (activation_triton.GELU_TANH, "gelu_tanh")):
        variants[f"{name}_and_mul_bf16"] = Variant(
            activation_triton._act_and_mul_kernel, dict(x_ptr="*bf16", out_ptr="*bf16"),
            dict(ACT=act, ROWS=gpu_rows(1024), BLOCK=1024),
            dict(num_warps=num_warps_for(gpu_rows(1024) * 1024)), decode=True,
        )
    # An INT4 model's output head in int8 (kernels/triton/int8_head.py): each row bucket's tiles.
    for limit, block_m, block_v, warps, stages in int8_head_triton.CONFIGS:
        for dtype in W4A16_DTYPES:
            variants[f"int8_head_m{limit or 'large'}_{dtype}"] = Variant(
                int8_head_triton._int8_head_kernel,
                dict(x_ptr=f"*{dtype}", q_ptr="*i8", s_ptr="*fp16", out_ptr=f"*{dtype}"),
                dict(BLOCK_M=block_m, BLOCK_V=block_v, DOT_F32=False, DOT_PRECISION="tf32"),
                dict(num_warps=warps, num_stages=stages), decode=limit is not None,
            )
    variants.update(pdl_twins(variants))
    return variants


# Decode kernels built again with programmatic dependent launch on Hopper (kernels/triton/pdl.py;
# ptxas refuses griddepcontrol below sm_90, where the twin is its plain self: built with the
# launch option alone, which keeps Triton's cache from serving it the plain build, whose
# ptxas log the matrix reads).
PDL_TWINS = ("rms_norm_residual_bf16_4096", "w4a16_marlin_gemv_bf16_g128_splitk",
             "w4a16_marlin_m16_bf16_g128_splitk", "lora_expand_bf16_graph_r64", "lora_grouped_fused_bf16_r16")


def pdl_twins(variants: dict[str, Variant]) -> dict[str, Variant]:
    twins = {}
    for name in PDL_TWINS:
        built = {}
        for arch in ARCHS:
            plain = variants[name].for_arch(arch)
            built[arch] = dataclasses.replace(
                plain, constexprs={**plain.constexprs, "PDL": arch >= 90},
                options={**plain.options, "launch_pdl": True}, on_arch=None)
        twins[f"{name}_pdl"] = dataclasses.replace(built[ARCHS[0]], on_arch=built)
    return twins


VARIANTS = build_variants()
