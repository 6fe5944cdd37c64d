"""Proposals from a draft model, run by a ModelRunner of its own with its own paged KV pool
and block tables (a BlockManager over the draft's pool, without prefix caching).

Each step, for every request asked to speculate k tokens: one forward over the tokens the
draft has not seen yet (the whole prompt the first time: that is the draft's prefill; after
that the newest token, plus the last draft if all were accepted), which yields draft 1, then
k - 1 one-token forwards for drafts 2..k. The draft's K/V for drafts 1..k-1 is written as it
goes; after verification only what the target accepted is kept (`on_verified` rolls the
draft back to the target's verified length and frees its blocks beyond). Preemption drops
the draft's K/V with the target's.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.request import Request
from kvdeck.engine.core.spec.draft_model import DraftModel
from kvdeck.engine.runner.spec.draft_sampling import DraftSampler
from kvdeck.engine.runner.spec.position_view import ExtendedSequence


@dataclass(slots=True, eq=False)
class DraftSequence(ExtendedSequence):
    """A request as the draft model runs it: the request's tokens plus this step's drafts,
    with the draft's own block table and computed length."""

    request: Request
    num_computed_tokens: int = 0
    block_tables: list[list[int]] = field(default_factory=list)  # one group: the draft's own
    block_hashes: list[int] = field(default_factory=list)  # always empty: no prefix caching
    table_epoch: int = 0  # bumped by the block manager (the runner's persistent rows read it)
    long_rope: bool = False  # the draft's rotary is its own (no LongRoPE switch)
    pending: list[int] = field(default_factory=list)  # drafts proposed this step
    spec_token_ids: list[int] = field(default_factory=list)  # the draft verifies nothing

    @property
    def block_table(self) -> list[int]:
        return self.block_tables[0] if self.block_tables else []

    @property
    def appended(self) -> Sequence[int]:
        return self.pending

    @property
    def num_tokens(self) -> int:
        return self.request.num_tokens + len(self.pending)

    def token_id_at(self, position: int) -> int:
        n = self.request.num_tokens
        return self.request.token_id_at(position) if position < n else self.pending[position - n]


@dataclass(slots=True)
class _Batch:
    """What the draft's ModelRunner reads (runner.batch.BatchPlan)."""

    requests: list[DraftSequence]
    num_new_tokens: list[int]


class DraftModelProposer:
    def __init__(self, draft: DraftModel, num_blocks: int, block_size: int) -> None:
        self.draft = draft
        self.runner = draft.runner
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.sampler = DraftSampler(self.runner.sampler)
        self.sequences: dict[str, DraftSequence] = {}
        self._probs: dict[str, torch.Tensor] = {}

    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], num_drafts: Sequence[int]) -> list[list[int]]:
        self._probs = {}
        batch, ks = [], []
        for request, k in zip(requests, num_drafts):
            seq = self.sequences.get(request.request_id)
            if seq is None:
                seq = self.sequences[request.request_id] = DraftSequence(request)
            seq.pending = []
            unseen = request.num_tokens - seq.num_computed_tokens
            # Slots for the unseen tokens and drafts 1..k-1 (draft k's K/V is never needed).
            if self.blocks.allocate_slots(seq, unseen + k - 1):
                batch.append(seq)
                ks.append(k)
        probs: dict[str, list[torch.Tensor]] = {seq.request_id: [] for seq in batch}
        step = _Batch(batch, [seq.request.num_tokens - seq.num_computed_tokens for seq in batch])
        while step.requests:
            logits, rows = self.runner.sample_logits(step)
            tokens, q = self.sampler.sample(logits, [step.requests[i] for i in rows])
            for seq, n in zip(step.requests, step.num_new_tokens):
                seq.num_computed_tokens += n
            for i, token, row_q in zip(rows, tokens, q):
                seq = step.requests[i]
                seq.pending.append(token)
                if not seq.params.greedy:
                    probs[seq.request_id].append(row_q)
            going = [seq for seq, k in zip(batch, ks) if len(seq.pending) < k]
            step = _Batch(going, [1] * len(going))
        self._probs = {rid: torch.stack(rows) for rid, rows in probs.items() if rows}
        # The draft's K/V now covers every draft but the last; drafts 1..k-1 are unverified.
        return [self.sequences[r.request_id].pending if r.request_id in probs else [] for r in requests]

    def draft_probs(self) -> dict[str, torch.Tensor] | None:
        return self._probs

    def on_verified(self, request: Request) -> None:
        seq = self.sequences.get(request.request_id)
        if seq is None:
            return
        seq.pending = []
        # Keep the K/V of what the target accepted; the rest is overwritten next time.
        seq.num_computed_tokens = min(seq.num_computed_tokens, request.num_computed_tokens)
        self.blocks.free_beyond(seq, seq.num_computed_tokens)

    def on_preempted(self, request: Request) -> None:
        seq = self.sequences.get(request.request_id)
        if seq is not None:
            self.blocks.free(seq)
            seq.num_computed_tokens = 0
            seq.pending = []

    def forget(self, request_id: str) -> None:
        seq = self.sequences.pop(request_id, None)
        if seq is not None:
            self.blocks.free(seq)
        self._probs.pop(request_id, None)
        self.sampler.forget(request_id)
        self.runner.forget(request_id)

    def pool_stats(self) -> tuple[int, list[int]]:
        return self.blocks.num_blocks, [b.ref_count for b in self.blocks.blocks]

    def sequence_stats(self, request_id: str) -> tuple[list[int], int] | None:
        seq = self.sequences.get(request_id)
        return None if seq is None else (list(seq.block_table), seq.num_computed_tokens)

    def shutdown(self) -> None:
        self.runner.shutdown()
