"""The Triton LoRA kernels' variants, for the start-up warm-up (engine/runner/warmup.py).

The shrink/expand pair (kernels/triton/lora.py) leaves the row count unspecialised; what
else varies from step to step is the step's largest rank, which Triton sees as the `rank`
argument, the h strides (slices * rank per chunk of K, slices * splits * rank per row) and
the rank block (BLOCK_R), and whether the step gives every row or a list of rows (HAS_ROWS).
Triton keys an int argument on whether it is 1 and whether it divides by 16
(kernels/triton/launch.py), so ranks 1..max_lora_rank fall into a few classes; one rank of
each, with every row and with some rows, compiles them all.
"""

from collections.abc import Iterable


def _block_r(rank: int) -> int:
    """The kernels' BLOCK_R: max(2, triton.next_power_of_2(rank)), without importing triton."""
    return max(2, 1 << (rank - 1).bit_length())


def _int_key(value: int) -> tuple[bool, bool]:
    return value == 1, value % 16 == 0


def warm_up_ranks(max_rank: int, rank_multipliers: Iterable[int]) -> list[int]:
    """The smallest rank of each class of ranks 1..max_rank the kernels compile one variant
    for, given what the h strides multiply the rank by: each fused layer's slice count (1:
    o/down, 2: gate_up, 3: qkv) and that times its shrink's splits of K."""
    counts = sorted(set(rank_multipliers))
    first: dict[tuple, int] = {}
    for rank in range(1, max_rank + 1):
        key = (_block_r(rank), _int_key(rank), tuple(_int_key(n * rank) for n in counts))
        first.setdefault(key, rank)
    return list(first.values())
