"""The runner's plain state: the KV pool's plan it reports at start-up (`KVCachePlan`), one
step's packed inputs (`StepInputs`) and what the step returns (`StepResult`)."""

from dataclasses import dataclass, field

import torch

from kvdeck.engine.runner.batch import ScheduledSequence
from kvdeck.engine.runner.lora.manager import LoRAStepPlan
from kvdeck.engine.runner.models.layers import AttentionMetadata
from kvdeck.engine.runner.sampler import SampleResult
from kvdeck.engine.runner.step_copies import StepCopies
from kvdeck.engine.types.outputs import Logprob


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    meta: AttentionMetadata | None = None
    num_requests: int = 0
    sample_rows: list[int] = field(default_factory=list)  # flat row of each sampled request
    sample_requests: list[ScheduledSequence] = field(default_factory=list)
    sample_batch_index: list[int] = field(default_factory=list)
    # Speculating requests: every row of their 1 + k chunk is sampled (rejection sampler).
    spec_rows: list[int] = field(default_factory=list)
    spec_requests: list[ScheduledSequence] = field(default_factory=list)
    spec_batch_index: list[int] = field(default_factory=list)
    # Prompt logprobs (prompt_logprobs.py): (batch row, first flat row, first position, number
    # of prompt tokens whose logprob the chunk's rows give).
    prompt_logprob_spans: list[tuple[int, int, int, int]] = field(default_factory=list)
    # SamplingParams.embed: (batch row, flat row of its last prompt token) in this step.
    embedding_rows: list[tuple[int, int]] = field(default_factory=list)
    # Multi-LoRA: the step's adapter per token (engine/runner/lora/manager.py); None: base rows only.
    lora: "LoRAStepPlan | None" = None
    # A decode graph's output head: (logits, greedy tokens) of every row, when it made them.
    graph_logits: tuple[torch.Tensor, torch.Tensor] | None = None
    # Async scheduling: input_ids[placeholder_dst] <- the step in flight's samples[placeholder_src].
    placeholder_dst: torch.Tensor | None = None
    placeholder_src: torch.Tensor | None = None
    # The KV tiers' and swaps' copies around the forward (async scheduling; step_copies.py).
    copies: StepCopies | None = None


@dataclass(slots=True, frozen=True)
class KVCachePlan:
    """How big the KV pool is, and why."""

    num_blocks: int
    block_size: int
    bytes_per_block: int  # K and V of one block over its layer slots (scales included)
    sized_by: str  # "override" (num_gpu_blocks_override) | "kv_cache_memory_gib" | "profiling"
    num_kv_groups: int = 1  # a token's K/V for every layer takes one block slot per group

    @property
    def num_tokens(self) -> int:
        """Tokens whose K/V the pool holds for every layer at once."""
        return self.num_blocks * self.block_size // self.num_kv_groups

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block * self.num_kv_groups // self.block_size


@dataclass(slots=True)
class StepResult:
    """One step's sampled tokens (None for rows still in their prompt) and its timings."""

    samples: list[SampleResult | None]
    prepare_s: float  # packing the batch into device tensors
    total_s: float  # prepare + forward + sampling
    failures: dict[int, str] = field(default_factory=dict)  # batch row -> why its sampling failed
    # Speculating requests: batch row -> the tokens its verified chunk emitted (accepted drafts,
    # then one more); their `samples` entry is None.
    spec_samples: dict[int, list[SampleResult]] = field(default_factory=dict)
    # SamplingParams.prompt_logprobs: batch row -> (its chunk's first position, the entries of
    # the prompt tokens after it, in order).
    prompt_logprobs: dict[int, tuple[int, list[dict[int, Logprob]]]] = field(default_factory=dict)
    # SamplingParams.embed: batch row -> its prompt's normalised embedding.
    embeddings: dict[int, list[float]] = field(default_factory=dict)
