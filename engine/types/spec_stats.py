"""Speculative decoding in the engine's stats snapshot (EngineStats.spec, RequestStats.spec):
what the dashboard draws (acceptance, speculative slots, the draft's blocks) and what
/metrics exports as vLLM's spec_decode_* counters."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestSpecStats:
    num_drafts: int = 0  # verification steps that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_history: list[int] = field(default_factory=list)  # accepted drafts per step, oldest first
    paused: bool = False  # poor recent acceptance: decoding without drafts for a while
    # The draft model's blocks for this request (ids in the draft's own pool); [] for n-gram.
    draft_block_table: list[int] = field(default_factory=list)
    draft_num_computed_tokens: int = 0
    # The gain policy's last decision for this request, in words ("" under the fixed policy).
    decision: str = ""

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Drafts accepted per verification step (tokens per step is one more)."""
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass(slots=True)
class SpecDecodeStats:
    method: str  # "ngram" | "suffix" | "draft_model" | "auto"
    num_speculative_tokens: int
    disable_by_batch_size: int | None
    # Counters since start (vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens,
    # _num_accepted_tokens_per_pos).
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # The last step. Slots are target KV slots (block_id * block_size + offset).
    last_step_disabled: bool = False  # the running batch was over disable_by_batch_size
    last_step_draft_tokens: int = 0
    last_step_accepted_tokens: int = 0
    slots_written_last_step: list[int] = field(default_factory=list)  # received draft K/V
    slots_rolled_back_last_step: list[int] = field(default_factory=list)  # held rejected drafts
    blocks_rolled_back_last_step: list[int] = field(default_factory=list)  # given back for them
    # The gain policy's last step: the speed-up it expected from the drafts it kept (1.0: it
    # kept none) and what a step's extra row costs, relative to a one-row step.
    draft_policy: str = "fixed"
    last_step_expected_speedup: float = 1.0
    extra_row_cost: float = 0.0
    # The draft model's own KV pool (method draft_model; same block size as the target's).
    draft_num_blocks: int = 0
    draft_block_ref_counts: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
