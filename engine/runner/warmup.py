"""Start-up warm-up: every kernel variant serving can launch, compiled before the first request.

A Triton kernel compiles on its first launch with a new specialisation (about a second on a
GPU): mid-serving that is a stall every running request sees. The kernels take their
batch-dependent ints unspecialised (kernels/triton/launch.py), so what is left to compile
is a short list, run here once on dummy inputs: prefill chunks whose token counts fall in
each W4A16 tile bucket and above the fused GEMM's limit, a mixed step (decode rows beside a
chunk: both attention launches), and the all-decode steps that run eagerly (each
flash-decoding split count they can choose; with CUDA graphs only batches above the largest
bucket run eagerly, and those never split). The decode graphs compile their buckets when
they are captured. With LoRA on the Triton path, the first dummy step also launches the
shrink/expand pair under each class of adapter rank (engine/runner/lora/warm_up.py). The K/V
the dummy steps write lands in blocks no request holds yet.
"""

import logging
from collections.abc import Callable

import torch

from kvdeck.engine.runner.models.layers import AttentionMetadata
from kvdeck.engine.types.arith import cdiv
from kvdeck.kernels.compile_counter import kernel_compiles
from kvdeck.kernels.triton.attention_tuning import MAX_SEGMENTS, MIN_TOKENS_PER_SEGMENT

logger = logging.getLogger(__name__)

# Token counts of a step that land in each W4A16 tile bucket (kernels/triton/w4a16_gemm.py's
# M_BUCKETS: 1-16, 17-32, 33-64, 65-256; a test keeps them in step) and above it (the
# dequantise + cuBLAS path), after one token: the repacked kernel's GEMV form, which a GPU's
# tuned table may serve the smallest batches (w4a16_marlin_plan.ArchTuning.gemv_max_tokens).
# Written out: importing the kernel module here would build it.
W4A16_STEP_TOKENS = (1, 16, 32, 64, 256, 257)
# choose_num_segments' split counts: powers of two up to MAX_SEGMENTS.
SPLIT_COUNTS = tuple(1 << i for i in range(MAX_SEGMENTS.bit_length()))


def warm_up_steps(max_model_len: int, token_budget: int, num_blocks: int, block_size: int,
                  eager_decode_splits: bool) -> list[tuple[list[int], list[int]]]:
    """The dummy steps as (query lengths, context lengths) per sequence, each fitting the
    pool, the token budget and max_model_len."""
    steps = []
    for tokens in W4A16_STEP_TOKENS:
        tokens = min(tokens, token_budget, max_model_len)
        steps.append(([tokens], [tokens]))
    steps.append(([1, 7], [9, 7]))  # a mixed step: one decode row beside a chunk
    if eager_decode_splits:  # one sequence whose length asks for c segments
        for count in SPLIT_COUNTS:
            length = count * MIN_TOKENS_PER_SEGMENT
            if length <= max_model_len and cdiv(length, block_size) <= num_blocks:
                steps.append(([1], [length]))
    else:  # the batches above the largest graph bucket: never split
        steps.append(([1], [2]))
    return list(dict.fromkeys((tuple(q), tuple(s)) for q, s in steps).keys())


@torch.inference_mode()
def run_step(model: torch.nn.Module, query_lens: list[int], seq_lens: list[int], block_size: int,
             num_blocks: int, num_kv_groups: int, device: torch.device) -> None:
    """One forward of a dummy batch (and its logits), its K/V written into blocks 0.. ."""
    tables, next_block = [], 0
    for length in seq_lens:
        needed = cdiv(length, block_size)
        tables.append([(next_block + i) % num_blocks for i in range(needed)])
        next_block += needed
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32,
                                device=device)
    positions = torch.cat([torch.arange(s - q, s) for q, s in zip(query_lens, seq_lens)]).to(device)
    rows = torch.cat([torch.full((q,), i) for i, q in enumerate(query_lens)]).to(device)
    slots = block_tables.long()[rows, positions // block_size] * block_size + positions % block_size
    starts = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=slots, block_tables=block_tables, query_start_loc=starts.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        other_groups=((slots, block_tables),) * (num_kv_groups - 1),
    )
    input_ids = torch.zeros(positions.shape[0], dtype=torch.long, device=device)
    hidden = model(input_ids, positions, meta)
    model.compute_logits(hidden[starts[1:].long().to(device) - 1])


def warm_up(run: Callable[[list[int], list[int]], None], steps: list[tuple[list[int], list[int]]]) -> int:
    """Run each dummy step; the kernel variants they compiled."""
    before = kernel_compiles()
    for query_lens, seq_lens in steps:
        run(list(query_lens), list(seq_lens))
    compiled = kernel_compiles() - before
    logger.info("warm-up: %d dummy steps, %d kernel variants compiled", len(steps), compiled)
    return compiled
