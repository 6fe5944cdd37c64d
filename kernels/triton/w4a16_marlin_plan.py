"""How a launch of the repacked W4A16 kernel (kernels/triton/w4a16_marlin.py) is shaped: its
tiles per M bucket and per GPU architecture, and its split-K count. Pure Python (no torch, no
triton.jit), so every rule here is unit-tested without a GPU or the interpreter.

Split-K without a partial second wave: at small M the grid is (M tiles x N tiles x splits),
and each program streams ceil(k_tiles / split) K tiles. A GPU runs `slots` programs at once
(SMs x programs resident per SM), so the launch takes ceil(programs / slots) waves, each as
long as one program: its time is waves x K tiles per program. `choose_split` minimises that,
which is the same as maximising `wave_efficiency`, the share of the waves' program slots
that do useful K tiles (1.0: whole waves of evenly split programs). A split count the launch
would round to another (K tiles that do not divide evenly) is skipped; ties go to fewer
splits (fewer partial tiles to write and sum).

Configs per architecture come from a committed GPU sweep: `w4a16_marlin_tuned.TUNED`,
written by benchmarks/w4a16_tune.py from bench_w4a16.py's sweep JSON. An architecture the
sweep has not measured keeps the defaults below, chosen without a GPU (AOT matrix: shared
memory and spills on sm_80..sm_90).
"""

import functools
from dataclasses import dataclass, fields, replace

from kvdeck.kernels.triton.w4a16_marlin_tuned import TUNED


@dataclass(frozen=True, slots=True)
class MarlinConfig:
    block_m: int
    block_n: int
    block_k: int  # at most: narrowed to divide the group
    split_k: int  # at most: `choose_split` fits it to the shape and the SM count
    num_warps: int
    num_stages: int
    broadcast_load: bool = False
    plain_dequant: bool = False  # the plain-Triton magic numbers on CUDA too, not the lop3 PTX
    # out^T = W^T x^T: the weight tile is the MMA's M side (BLOCK_N wide), the few tokens its N
    # side, as CUTLASS's swap-AB does for small M. On sm_90 at BLOCK_N 128 Triton then issues
    # Hopper's wgmma with the weights through shared memory: 3.70 instructions a weight in the
    # K loop against 3.87 unswapped (no activation-fragment moves). A sweep candidate.
    swap_ab: bool = False
    # The GEMV form (kernels/triton/w4a16_gemv.py): no tensor cores, one activation row a
    # program (block_m 1), each packed word dotted with its eight activations in inline PTX.
    gemv: bool = False


# (largest M of the bucket, its config). The limits are the AWQ-layout kernel's (the engine's
# warm-up compiles each); a tuned table may change the configs, never the limits.
M_BUCKETS: tuple[tuple[int, MarlinConfig], ...] = (
    (16, MarlinConfig(block_m=16, block_n=64, block_k=128, split_k=16, num_warps=4, num_stages=4)),
    (32, MarlinConfig(block_m=32, block_n=64, block_k=128, split_k=8, num_warps=4, num_stages=4)),
    (64, MarlinConfig(block_m=64, block_n=128, block_k=64, split_k=4, num_warps=8, num_stages=3)),
    (256, MarlinConfig(block_m=128, block_n=128, block_k=64, split_k=2, num_warps=8, num_stages=3)),
)
BUCKET_LIMITS = tuple(limit for limit, _ in M_BUCKETS)
# Above this many rows: dequantise on the device, then cuBLAS (the large-M path).
FUSED_MAX_TOKENS = M_BUCKETS[-1][0]
# The broadcast-load unpacking at decode sizes: its loads are [BLOCK_K, BLOCK_N] int32 in shared
# memory (8x the packed tile), so its K tile is halved to fit sm_86/sm_89's 99 KiB.
BROADCAST_CONFIG = MarlinConfig(block_m=16, block_n=64, block_k=64, split_k=16, num_warps=4,
                                num_stages=3, broadcast_load=True)
# The swapped product at decode sizes (MarlinConfig.swap_ab), 128 weight columns a tile: the
# AOT matrix builds it for every arch, the sweep times it beside the default.
SWAP_CONFIG = MarlinConfig(block_m=16, block_n=128, block_k=128, split_k=16, num_warps=4,
                           num_stages=4, swap_ab=True)
# The GEMV form's default (sm_90: 3.11 instructions a weight in its K loop for fp16, 3.28 for
# bf16, against the fused kernel's 4.38 and 4.59; 26 KB, 71-96 registers, no spills); served to
# the smallest batches only where a GPU sweep measured it faster (ArchTuning.gemv_max_tokens).
GEMV_CONFIG = MarlinConfig(block_m=1, block_n=128, block_k=128, split_k=16, num_warps=4, num_stages=4,
                           gemv=True)
MIN_K_TILES_PER_SPLIT = 2
# Programs an SM runs at once in the wave model (small tiles, few warps); a sweep may tune it.
PROGRAMS_PER_SM = 2


@dataclass(frozen=True, slots=True)
class ArchTuning:
    """What the kernel reads for one architecture (SM version, e.g. 90 for sm_90)."""
    buckets: tuple[tuple[int, MarlinConfig], ...] = M_BUCKETS
    programs_per_sm: int = PROGRAMS_PER_SM
    fused_max_tokens: int = FUSED_MAX_TOKENS
    # Up to this many rows the GEMV form serves (`gemv`); 0: never (untuned).
    gemv_max_tokens: int = 0
    gemv: MarlinConfig = GEMV_CONFIG
    source: str = "defaults (no GPU sweep)"


DEFAULT_TUNING = ArchTuning()
CONFIG_FIELDS = tuple(f.name for f in fields(MarlinConfig))


def tuning_from_table(entry: dict) -> ArchTuning:
    """One TUNED entry (plain data, as benchmarks/w4a16_tune.py writes it) as an ArchTuning;
    a bucket it leaves out keeps its default config."""
    given = {int(limit): MarlinConfig(**config) for limit, config in entry.get("buckets", ())}
    unknown = set(given) - set(BUCKET_LIMITS)
    if unknown:
        raise ValueError(f"tuned buckets {sorted(unknown)} are not M bucket limits {BUCKET_LIMITS}")
    fused = int(entry.get("fused_max_tokens", FUSED_MAX_TOKENS))
    if fused not in (0, *BUCKET_LIMITS):
        raise ValueError(f"fused_max_tokens {fused} must be 0 or a bucket limit {BUCKET_LIMITS}")
    programs = int(entry.get("programs_per_sm", PROGRAMS_PER_SM))
    if programs < 1:
        raise ValueError(f"programs_per_sm must be >= 1, got {programs}")
    gemv_max = int(entry.get("gemv_max_tokens", 0))
    if not 0 <= gemv_max <= BUCKET_LIMITS[0]:
        raise ValueError(f"gemv_max_tokens {gemv_max} must be 0..{BUCKET_LIMITS[0]} (the first bucket)")
    gemv = MarlinConfig(**entry["gemv"]) if "gemv" in entry else GEMV_CONFIG
    if not gemv.gemv or gemv.block_m != 1 or gemv.swap_ab or gemv.broadcast_load:
        raise ValueError(f"the gemv config must be the GEMV form (gemv, block_m 1, no swap or "
                         f"broadcast load), got {gemv}")
    return ArchTuning(buckets=tuple((limit, given.get(limit, cfg)) for limit, cfg in M_BUCKETS),
                      programs_per_sm=programs, fused_max_tokens=fused, gemv_max_tokens=gemv_max,
                      gemv=gemv, source=str(entry.get("source", "tuned")))


# SM version -> its tuning; `use_tuning` may add one, None (off CUDA) included.
_TUNINGS: dict[int | None, ArchTuning] = {int(arch): tuning_from_table(entry)
                                          for arch, entry in TUNED.items()}


def tuning(arch: int | None) -> ArchTuning:
    """The configs for an SM version (None: not a GPU, the defaults unless `use_tuning` said)."""
    return _TUNINGS.get(arch, DEFAULT_TUNING)


def use_tuning(arch: int | None, entry: dict) -> ArchTuning:
    """Serve `arch` (None: off CUDA, as under the interpreter) with a TUNED-style entry in this
    process, over the committed table: bench_w4a16.py times its own sweep's pick before anyone
    commits it. Launch configs are cached by tuning object, so later launches see it at once."""
    _TUNINGS[arch] = chosen = tuning_from_table(entry)
    return chosen


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_tiles(k_tiles: int, split: int) -> tuple[int, int]:
    """(K tiles per program, splits the launch runs) for a requested split count: each split
    takes whole K tiles, so 10 tiles in 4 splits run as 3 splits of 4, 4 and 2."""
    per = _cdiv(k_tiles, max(1, split))
    return per, _cdiv(k_tiles, per)


def wave_efficiency(tiles: int, k_tiles: int, split: int, slots: int) -> float:
    """Useful K-tile work / (waves x slots x K tiles per program): 1.0 when the programs fill
    whole waves and K divides evenly among the splits."""
    per, split = split_tiles(k_tiles, split)
    slots = max(1, slots)
    waves = _cdiv(tiles * split, slots)
    return tiles * k_tiles / (waves * slots * per)


def choose_split(tiles: int, k_tiles: int, max_split: int, slots: int) -> int:
    """The split count (<= max_split, each split >= MIN_K_TILES_PER_SPLIT K tiles) whose launch
    takes the least waves x K tiles per program on `slots` concurrent programs; ties: fewer."""
    best, best_cost = 1, None
    for split in range(1, max(1, max_split) + 1):
        if split > 1 and k_tiles // split < MIN_K_TILES_PER_SPLIT:
            break
        per, runs = split_tiles(k_tiles, split)
        if runs != split:  # the launch would run `runs` splits: counted there
            continue
        cost = _cdiv(tiles * split, max(1, slots)) * per
        if best_cost is None or cost < best_cost:
            best, best_cost = split, cost
    return best


def bucket_config(m: int, arch: int | None = None) -> MarlinConfig:
    return _bucket(tuning(arch), m)


def _bucket(arch_tuning: ArchTuning, m: int) -> MarlinConfig:
    if m <= arch_tuning.gemv_max_tokens:
        return arch_tuning.gemv
    buckets = arch_tuning.buckets
    return next((cfg for limit, cfg in buckets if m <= limit), buckets[-1][1])


def choose_config(m: int, n: int, k: int, group_size: int, num_sms: int,
                  arch: int | None = None) -> MarlinConfig:
    """The bucket's config for an [m, k] x [k, n] product on `arch` (its tuned table, else the
    defaults), block_k fitted to the group and split_k to the shape and `num_sms`."""
    return _fitted_config(m, n, k, group_size, num_sms, tuning(arch))


@functools.lru_cache(maxsize=4096)  # every launch asks; a model has few shapes (all frozen)
def _fitted_config(m: int, n: int, k: int, group_size: int, num_sms: int,
                   arch_tuning: ArchTuning) -> MarlinConfig:
    bucket = _bucket(arch_tuning, m)
    block_k = min(bucket.block_k, group_size)  # powers of two: divides the group
    tiles = _cdiv(m, bucket.block_m) * _cdiv(n, bucket.block_n)
    slots = num_sms * arch_tuning.programs_per_sm
    split_k = choose_split(tiles, k // block_k, bucket.split_k, slots)
    return replace(bucket, block_k=block_k, split_k=split_k)
