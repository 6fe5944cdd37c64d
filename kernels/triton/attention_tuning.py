"""Launch policy of the Triton paged attention: tile configs and the flash-decoding split.

Kept apart from the kernel so it can be read, tested and tuned without triton.
"""

import functools
import math
from dataclasses import dataclass

import torch

# Flash-decoding only pays off when each segment still streams a few KV tiles.
MIN_TOKENS_PER_SEGMENT = 256
MAX_SEGMENTS = 32


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    block_m: int  # rows per program = BLOCK_Q query tokens * GROUP heads (padded)
    tile_n: int  # KV tokens per inner-loop tile
    num_warps: int
    num_stages: int


# Chosen without a GPU: shared memory within sm_86/sm_89's 99 KiB and no register spills in
# the decode configs on sm_80..sm_89 (benchmarks/compile_for_gpu.py, table in
# kernels/README.md). Only Hopper's have been timed (below); benchmarks/bench_kernels.py
# --sweep compares alternatives on any GPU.
DECODE_CONFIG = AttentionConfig(block_m=16, tile_n=64, num_warps=4, num_stages=3)
PREFILL_CONFIG = AttentionConfig(block_m=64, tile_n=64, num_warps=8, num_stages=2)
PREFILL_CONFIG_SMALL_HEAD = AttentionConfig(block_m=128, tile_n=64, num_warps=8, num_stages=2)
# K/V rows wider than WIDE_ROW_BYTES (head dim 256 in 16 bits, 128 in fp32) take half-length
# KV tiles: 64-token tiles and their pipeline copies overflow 99 KiB in prefill (104 KiB at
# head dim 256) and spill registers in decode.
WIDE_ROW_BYTES = 256
DECODE_CONFIG_WIDE_ROWS = AttentionConfig(block_m=16, tile_n=32, num_warps=4, num_stages=3)
PREFILL_CONFIG_WIDE_ROWS = AttentionConfig(block_m=64, tile_n=32, num_warps=8, num_stages=2)


# 8-bit caches (element_size 1) decode each tile to 16 bits in registers first: with 64-token
# tiles at head dim 128 the decode kernel spills on sm_86/sm_90, with 32-token ones it does not.
DECODE_CONFIG_8BIT = DECODE_CONFIG_WIDE_ROWS


# Hopper (sm_90), measured on an H100 (benchmarks/results/gpu_h100_2026-11-28.log,
# `bench_kernels.py --sweep`, medians of CUDA-graph replays): 128-token KV tiles decode 3-18%
# faster than DECODE_CONFIG at 17 of 18 shapes (the heads of Llama-3.2-1B, Qwen3-0.6B and
# Llama-3.1-8B, batch 1-256; the 18th within 1%), and 4-warp, 3-stage tiles prefill
# Llama-3.1-8B's heads over 8192 tokens 1.27x faster than PREFILL_CONFIG. Hopper's 227 KiB of
# shared memory per block holds both (benchmarks/compile_for_gpu.py). 16-bit caches only:
# the sweep timed bf16, and wider or 8-bit rows keep their own tiles above.
HOPPER_ARCH = 90
HOPPER_DECODE_CONFIG = AttentionConfig(block_m=16, tile_n=128, num_warps=4, num_stages=2)
HOPPER_PREFILL_CONFIG = AttentionConfig(block_m=64, tile_n=64, num_warps=4, num_stages=3)


# The CPU interpreter pays per program and per op, not per element: big tiles, few loops.
INTERPRETER_CONFIG = AttentionConfig(block_m=128, tile_n=128, num_warps=4, num_stages=1)


def default_config(max_query_len: int, head_dim: int, device: torch.device,
                   element_size: int = 2, arch: int | None = None) -> AttentionConfig:
    """Tiles for one launch: decode rows (max_query_len 1) stream K/V, prefill chunks need
    big dots. `element_size` is the bytes per cache element; `arch` the SM version (default:
    the device's; given when compiling ahead of time)."""
    if device.type != "cuda":
        return INTERPRETER_CONFIG
    padded_head_dim = 1 << (head_dim - 1).bit_length()  # the kernel's HEAD_DIM_PAD
    wide_rows = padded_head_dim * element_size > WIDE_ROW_BYTES
    hopper = element_size == 2 and not wide_rows and (
        arch if arch is not None else cuda_arch(device)) == HOPPER_ARCH
    if max_query_len == 1:
        if element_size == 1:
            return DECODE_CONFIG_8BIT
        if hopper:
            return HOPPER_DECODE_CONFIG
        return DECODE_CONFIG_WIDE_ROWS if wide_rows else DECODE_CONFIG
    if wide_rows:
        return PREFILL_CONFIG_WIDE_ROWS
    if head_dim <= 64:
        return PREFILL_CONFIG_SMALL_HEAD
    return HOPPER_PREFILL_CONFIG if hopper else PREFILL_CONFIG


def cuda_arch(device: torch.device) -> int:
    """The SM version (major * 10 + minor) of a CUDA device, looked up once per device."""
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _arch_of(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


def choose_num_segments(
    num_seqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int, num_sms: int
) -> int:
    """Flash-decoding split count: >1 only for all-decode batches too small to fill the GPU."""
    programs = num_seqs * num_kv_heads
    if max_query_len != 1 or programs >= 2 * num_sms:
        return 1
    wanted = min(
        math.ceil(2 * num_sms / programs), max_seq_len // MIN_TOKENS_PER_SEGMENT, MAX_SEGMENTS
    )
    # Powers of two keep the number of compiled variants small.
    return 1 if wanted < 2 else 1 << (wanted.bit_length() - 1)


def streaming_multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter gains nothing from splitting
    return torch.cuda.get_device_properties(device).multi_processor_count
