"""Decode steps replayed from CUDA graphs, one per batch-size bucket (as vLLM and nano-vllm).

A decode step launches a few hundred small kernels; at small batch sizes the GPU waits on
the host issuing them. A CUDA graph records the launches once and replays them with one
call. Graphs read and write fixed addresses, so each step's inputs are copied into static
buffers, padded up to the nearest captured batch size. Padding rows carry slot -1 (the
KV write skips them) and a one-token context, and their outputs are dropped.

Only decode-only batches (every row one new token) take this path; prefill and mixed
steps, and batches above the largest bucket, run eagerly.

The attention kernel splits a small batch's rows across segments (flash-decoding) by the
longest context it was launched for, and a graph fixes that count: captured for
max_model_len alone, a batch-1 step of a few hundred tokens would launch 32 mostly empty
segments and merge them, every layer. So a small bucket also has graphs captured for
shorter lengths, one for each split count below max_model_len's (`split_tiers`), and a step
replays the shortest that covers its longest row: no more segments than its context fills.

With LoRA (`lora`: the manager's graph inputs, engine/runner/lora/graph_inputs.py) every
bucket and tier has a second graph, captured with the adapter layers, which decode-only
steps with adapter rows replay (each row's slot copied into a static buffer, padding rows
at -1). Base-only steps keep replaying the plain graphs, so they pay nothing for LoRA.
"""

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from kvdeck.engine.runner.lora.graph_inputs import LoRAGraphInputs
from kvdeck.engine.runner.models.layers import AttentionMetadata
from kvdeck.engine.types.arith import cdiv
from kvdeck.kernels.triton.attention_tuning import MIN_TOKENS_PER_SEGMENT, choose_num_segments

logger = logging.getLogger(__name__)

MAX_CAPTURED_BATCH = 512


def split_tiers(batch_size: int, max_model_len: int, num_kv_heads: int, num_sms: int) -> list[int]:
    """Context lengths below max_model_len at which the attention splits a `batch_size` decode
    into fewer segments than at max_model_len: the longest length of each such split count."""
    full = choose_num_segments(batch_size, num_kv_heads, 1, max_model_len, num_sms)
    longest_of: dict[int, int] = {}
    length = MIN_TOKENS_PER_SEGMENT
    while length < max_model_len:
        longest_of[choose_num_segments(batch_size, num_kv_heads, 1, length, num_sms)] = length
        length *= 2
    return sorted(length for count, length in longest_of.items() if count != full)


def decode_bucket_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_num_seqs (capped)."""
    limit = min(max_num_seqs, MAX_CAPTURED_BATCH)
    sizes = [size for size in (1, 2, 4, 8) if size <= limit]
    sizes += list(range(16, limit + 1, 16))
    if sizes[-1] < limit:
        sizes.append(limit)
    return sizes


@dataclass(slots=True)
class DecodeBuffers:
    """The static tensors every captured graph reads from and writes to."""

    input_ids: torch.Tensor  # [max_batch]
    positions: torch.Tensor  # [max_batch]
    slot_mappings: list[torch.Tensor]  # per KV group: [max_batch]
    block_tables: list[torch.Tensor]  # per KV group: [max_batch, max_blocks_per_seq]
    query_start_loc: torch.Tensor  # [max_batch + 1], always 0..max_batch: one token per row
    seq_lens: torch.Tensor  # [max_batch]
    hidden: torch.Tensor  # [max_batch, hidden_size]

    @classmethod
    def allocate(cls, max_batch: int, max_blocks_per_seq: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, num_kv_groups: int = 1) -> "DecodeBuffers":
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        return cls(
            input_ids=zeros(max_batch),
            positions=zeros(max_batch),
            slot_mappings=[torch.full((max_batch,), -1, dtype=torch.long, device=device)
                           for _ in range(num_kv_groups)],
            block_tables=[zeros(max_batch, max_blocks_per_seq, dtype=torch.int32)
                          for _ in range(num_kv_groups)],
            query_start_loc=torch.arange(max_batch + 1, dtype=torch.int32, device=device),
            seq_lens=torch.ones(max_batch, dtype=torch.int32, device=device),
            hidden=zeros(max_batch, hidden_size, dtype=dtype),
        )

    def metadata(self, batch_size: int, max_seq_len: int) -> AttentionMetadata:
        groups = [(slots[:batch_size], tables[:batch_size])
                  for slots, tables in zip(self.slot_mappings, self.block_tables)]
        return AttentionMetadata(
            slot_mapping=groups[0][0],
            block_tables=groups[0][1],
            query_start_loc=self.query_start_loc[: batch_size + 1],
            seq_lens=self.seq_lens[:batch_size],
            max_query_len=1,
            # Host-side only (the attention kernel's split count); the kernel reads each
            # row's true length from seq_lens, so one graph serves every context length.
            max_seq_len=max_seq_len,
            other_groups=tuple(groups[1:]),
        )


class DecodeGraphs:
    """Captured decode forwards keyed by padded batch size."""

    def __init__(self, model: torch.nn.Module, max_num_seqs: int, max_model_len: int, block_size: int,
                 hidden_size: int, dtype: torch.dtype, device: torch.device, num_kv_groups: int = 1,
                 num_kv_heads: int | None = None, num_sms: int | None = None,
                 with_logits: bool = False, lora: LoRAGraphInputs | None = None) -> None:
        """`num_kv_heads`, `num_sms`: the attention's split policy (split_tiers); without
        them each bucket has its max_model_len graph alone. `with_logits`: the graphs also run
        the output head and the greedy argmax (`logits`, `greedy_tokens` after a run), so a
        greedy step samples without another launch. `lora`: also capture the adapter graphs."""
        self.model = model
        self.lora = lora
        self.with_logits = with_logits
        self.logits: torch.Tensor | None = None  # [max_batch, vocab], allocated by the first forward
        self.greedy: torch.Tensor | None = None  # [max_batch]
        self.last_rows = 0  # rows of the last run
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.dtype = dtype
        self.sizes = decode_bucket_sizes(max_num_seqs)
        max_blocks_per_seq = cdiv(max_model_len, block_size)
        self.buffers = DecodeBuffers.allocate(self.sizes[-1], max_blocks_per_seq, hidden_size, dtype,
                                              device, num_kv_groups)
        self.replays: dict[int, Callable[[], None]] = {}  # per bucket, captured for max_model_len
        self.tiers: dict[int, list[int]] = {
            size: split_tiers(size, max_model_len, num_kv_heads, num_sms) if num_kv_heads and num_sms else []
            for size in self.sizes}
        self.tier_replays: dict[tuple[int, int], Callable[[], None]] = {}  # (bucket, length)
        # The adapter graphs, (bucket, tier length or None for max_model_len's).
        self.lora_replays: dict[tuple[int, int | None], Callable[[], None]] = {}

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def _forward(self, batch_size: int, max_seq_len: int | None = None, with_lora: bool = False) -> None:
        buffers = self.buffers
        meta = buffers.metadata(batch_size, max_seq_len or self.max_model_len)
        ids, positions = buffers.input_ids[:batch_size], buffers.positions[:batch_size]
        if with_lora:
            buffers.hidden[:batch_size] = self.lora.forward(self.model, ids, positions, meta, batch_size)
        else:
            buffers.hidden[:batch_size] = self.model(ids, positions, meta)
        if self.with_logits:
            logits = self.model.compute_logits(buffers.hidden[:batch_size])
            if self.logits is None:  # the first (eager) forward, never inside a capture
                self.logits = logits.new_empty(self.max_batch_size, logits.shape[1])
                self.greedy = torch.empty(self.max_batch_size, dtype=torch.long, device=logits.device)
            self.logits[:batch_size] = logits
            self.greedy[:batch_size] = logits.argmax(dim=-1)

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per bucket (and per bucket with LoRA), largest first so the smaller
        ones reuse its memory pool."""
        pool = None
        for size in reversed(self.sizes):
            for length in [None, *self.tiers[size]]:
                for with_lora in self._lora_modes():
                    self._forward(size, length, with_lora)  # compiles and autotunes outside the capture
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self._forward(size, length, with_lora)
                    pool = graph.pool()
                    if with_lora:
                        self.lora_replays[size, length] = graph.replay
                    elif length is None:
                        self.replays[size] = graph.replay
                    else:
                        self.tier_replays[size, length] = graph.replay
        torch.cuda.synchronize()

    def _lora_modes(self) -> tuple[bool, ...]:
        return (False, True) if self.lora is not None else (False,)

    def use_eager_replays(self) -> None:
        """Run the same static-buffer path without capturing: how the padding and buffer
        handling is tested on machines without CUDA."""
        self.replays = {size: (lambda size=size: self._forward(size)) for size in self.sizes}
        self.tier_replays = {(size, length): (lambda size=size, length=length: self._forward(size, length))
                             for size, lengths in self.tiers.items() for length in lengths}
        if self.lora is not None:
            self.lora_replays = {
                (size, length): (lambda size=size, length=length: self._forward(size, length, True))
                for size in self.sizes for length in [None, *self.tiers[size]]}

    def can_run(self, meta: AttentionMetadata, num_seqs: int) -> bool:
        return (bool(self.replays) and meta.max_query_len == 1 and num_seqs <= self.max_batch_size
                and meta.block_tables.shape[1] <= self.buffers.block_tables[0].shape[1])

    def can_run_lora(self, meta: AttentionMetadata, num_seqs: int) -> bool:
        """Whether a step with adapter rows can replay the adapter graphs."""
        return bool(self.lora_replays) and self.can_run(meta, num_seqs)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            lora_slots: np.ndarray | None = None) -> torch.Tensor:
        """Copy the step into the static buffers, replay its bucket, return [num_seqs, hidden].
        `lora_slots` (each row's adapter slot, -1: the base; int64 on the host): replay the adapter graphs."""
        num_seqs = input_ids.shape[0]
        size = self.sizes[bisect.bisect_left(self.sizes, num_seqs)]
        buffers = self.buffers
        buffers.input_ids[:num_seqs].copy_(input_ids, non_blocking=True)
        buffers.positions[:num_seqs].copy_(positions, non_blocking=True)
        buffers.seq_lens[:num_seqs].copy_(meta.seq_lens, non_blocking=True)
        for group, (slot_buffer, table_buffer) in enumerate(zip(buffers.slot_mappings,
                                                                buffers.block_tables)):
            slots, tables = meta.group(group)
            slot_buffer[:num_seqs].copy_(slots, non_blocking=True)
            table_buffer[:num_seqs, : tables.shape[1]].copy_(tables, non_blocking=True)
            # Padding rows: no KV write, a one-token context read through whatever table row
            # is left over (always valid block ids), outputs ignored.
            slot_buffer[num_seqs:size].fill_(-1)
        buffers.seq_lens[num_seqs:size].fill_(1)
        tier = next((length for length in self.tiers[size] if length >= meta.max_seq_len), None)
        if lora_slots is not None:
            self.lora.set_rows(lora_slots, size)
            self.lora_replays[size, tier]()
        else:
            (self.replays[size] if tier is None else self.tier_replays[size, tier])()
        self.last_rows = num_seqs
        return buffers.hidden[:num_seqs]

    def last_logits(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last run's logits and greedy tokens, one row per step row (with_logits)."""
        if self.logits is None:
            return None
        return self.logits[: self.last_rows], self.greedy[: self.last_rows]

    @torch.inference_mode()
    def compare_with_eager(self, num_blocks: int) -> float | None:
        """Replay decode steps and compare each with the eager forward on the same inputs: a
        small batch (3 rows, padded to 4), the largest bucket full, and long contexts (where
        the attention kernel splits each row), each cut to the largest bucket. The largest
        difference beyond rounding, or None when every replay matches."""
        bs, rows = self.block_size, self.max_batch_size
        longest = min(self.max_model_len, num_blocks * bs)
        cases = [
            [1, bs + 2, 2 * bs + 5],
            [(row * 7) % (2 * bs) + 1 for row in range(rows)],
            [longest, max(1, longest // 2 + 3)],
        ]
        worst: float | None = None
        for seq_lens in cases:
            seq_lens = seq_lens[:rows]  # max_num_seqs 1 or 2 (batch-1 decode): no bigger step exists
            diff = self._compare_case(seq_lens, num_blocks)
            if diff is not None:
                worst = diff if worst is None else max(worst, diff)
        return worst

    def _compare_case(self, seq_lens: list[int], num_blocks: int) -> float | None:
        bs, device = self.block_size, self.buffers.hidden.device
        positions = torch.tensor([n - 1 for n in seq_lens], device=device)
        groups, next_block = [], 0
        for _ in self.buffers.block_tables:  # each KV group its own blocks
            rows = []
            for n in seq_lens:  # distinct blocks per row while the pool lasts, as the block manager would
                needed = cdiv(n, bs)
                rows.append([(next_block + i) % num_blocks for i in range(needed)])
                next_block += needed
            width = max(len(r) for r in rows)
            tables = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32,
                                  device=device)
            slots = tables.long().gather(1, (positions // bs)[:, None])[:, 0] * bs + positions % bs
            groups.append((slots, tables))
        meta = AttentionMetadata(
            slot_mapping=groups[0][0], block_tables=groups[0][1],
            query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            max_query_len=1, max_seq_len=max(seq_lens), other_groups=tuple(groups[1:]),
        )
        input_ids = torch.arange(len(seq_lens), device=device) % 97 + 1
        eager = self.model(input_ids, positions, meta).float()
        replayed = self.run(input_ids, positions, meta).float()
        diff = self._mismatch(eager, replayed)
        if self.lora is not None:  # the adapter graphs against the same adapter forward, eager
            lora_slots = np.arange(len(seq_lens)) % (self.lora.num_slots + 1) - 1
            self.lora.set_rows(lora_slots, len(seq_lens))
            eager = self.lora.forward(self.model, input_ids, positions, meta, len(seq_lens)).float()
            replayed = self.run(input_ids, positions, meta, lora_slots).float()
            lora_diff = self._mismatch(eager, replayed)
            if lora_diff is not None:
                diff = lora_diff if diff is None else max(diff, lora_diff)
        return diff

    def _mismatch(self, eager: torch.Tensor, replayed: torch.Tensor) -> float | None:
        diff = (eager - replayed).abs().max().item()
        # Graphs fix the attention split count, so low-precision sums may round differently.
        tolerance = 1e-4 if self.dtype == torch.float32 else 5e-2
        return diff if not diff <= tolerance * max(1.0, eager.abs().max().item()) else None
