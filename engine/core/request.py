"""One request's state inside EngineCore (token ids only).

It is what the runner reads of a scheduled sequence (`kvdeck.engine.runner.batch`).
"""

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdeck.engine.core.request_timeline import RequestTimeline
from kvdeck.engine.types.outputs import Logprob, RequestMetrics
from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.engine.types.wire import EngineCoreOutput, RequestStatus

if TYPE_CHECKING:
    from kvdeck.engine.grammar.matchers import GrammarState
    from kvdeck.engine.types.lora import LoRARequest

# A block-table entry that holds no block: released after sliding out of its group's
# window, or never needed there (below the window of a prefix-cache hit).
NO_BLOCK = -1


@dataclass(slots=True, eq=False)  # identity: two requests are never the same
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: set[int]
    arrival_time: float = field(default_factory=time.time)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache. After preemption it drops to 0 and the prompt
    # plus the output so far are recomputed (with prefix-cache help).
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first schedule
    # Of those, the ones copied in from the host tier and from the disk tier (kv_tiers.py).
    num_cached_tokens_host: int = 0
    num_cached_tokens_disk: int = 0
    # One table per KV cache group (`engine/types/kv_groups.py`; most models have one):
    # logical block i -> physical block id, or NO_BLOCK. Empty while the request holds none.
    block_tables: list[list[int]] = field(default_factory=list)
    # Bumped by the block manager whenever a table changes other than by appending (freed,
    # shrunk, an entry released): the runner's persistent rows then copy it again whole.
    table_epoch: int = 0
    # Hash of each full block (prefix caching), shared by the groups; len <= len of a table.
    block_hashes: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    # Speculative decoding: draft tokens to verify after the newest token this step (set by
    # the proposer before scheduling, trimmed by the scheduler to what fits, cleared after).
    spec_token_ids: list[int] = field(default_factory=list)
    # LongRoPE models: its K/V rotate with the long factors (it grew past the pretraining
    # context). Such blocks never serve a short request's prefix, nor the reverse.
    long_rope: bool = False
    stop_reason: int | str | None = None
    grammar: "GrammarState | None" = None  # structured outputs: its matcher, once compiled
    # The LoRA adapter it runs under (None: the base model). Its blocks are cached under the
    # adapter (block_manager's root hash), and a step holds at most max_loras adapters.
    lora_request: "LoRARequest | None" = None
    # A sampled token not in stop_ids, with the output shorter than length_limit, cannot stop
    # it (Scheduler.add_request sets both; 0 means: always check).
    stop_ids: frozenset[int] = frozenset()
    length_limit: int = 0
    # SamplingParams.prompt_logprobs: the entries of prompt positions 1.. computed so far (None:
    # not asked for), handed on once, with the first token.
    prompt_logprobs: list[dict[int, Logprob]] | None = field(init=False)
    prompt_logprobs_sent: bool = False
    embedding: list[float] | None = None  # SamplingParams.embed: set by its last prompt chunk's step
    metrics: RequestMetrics = field(init=False)
    timeline: RequestTimeline = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_logprobs = [] if self.params.prompt_logprobs is not None else None
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        # Its arrival on the monotonic clock (the front-end stamps arrival_time with time.time()).
        self.timeline = RequestTimeline(time.monotonic() - max(0.0, time.time() - self.arrival_time))

    @property
    def block_table(self) -> list[int]:
        """The first group's table (the only one unless the model is hybrid)."""
        return self.block_tables[0] if self.block_tables else []

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_id_at(self, position: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    def token_ids_between(self, start: int, end: int) -> tuple[int, ...]:
        """The token ids at positions start..end-1, without joining prompt and output."""
        prompt = self.prompt_token_ids
        n = len(prompt)
        if end <= n:
            return tuple(prompt[start:end])
        if start >= n:
            return tuple(self.output_token_ids[start - n : end - n])
        return (*prompt[start:], *self.output_token_ids[: end - n])

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Its prompt logprobs are not all computed: its prompt may not come from the cache."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1

    def add_prompt_logprobs(self, start: int, entries: list[dict[int, Logprob]]) -> None:
        """A chunk's entries for prompt positions start+1..; a chunk computed again after a
        preemption adds only what is new."""
        have = len(self.prompt_logprobs)
        if start <= have:
            self.prompt_logprobs.extend(entries[have - start :])

    def take_embedding(self) -> list[float] | None:
        """The embedding once (it goes out with the first token)."""
        embedding, self.embedding = self.embedding, None
        return embedding

    def take_prompt_logprobs(self) -> list[dict[int, Logprob]] | None:
        if self.prompt_logprobs is None or self.prompt_logprobs_sent:
            return None
        self.prompt_logprobs_sent = True
        return self.prompt_logprobs

    @property
    def waiting_for_grammar(self) -> bool:
        return self.grammar is not None and not self.grammar.ready

    @property
    def is_prefilling(self) -> bool:
        """True until every token but the newest sampled one has its K/V computed."""
        return self.num_tokens - self.num_computed_tokens > 1 or not self.output_token_ids


def token_output(request: Request, samples: list) -> EngineCoreOutput:
    """A request's new tokens (its samples of a step, at least one) as the core hands them on."""
    status = request.status
    return EngineCoreOutput(
        request.request_id, [s.token_id for s in samples], status.value if status.finished else None,
        request.stop_reason, [s.logprobs for s in samples] if samples[0].logprobs is not None else None,
        request.metrics, request.num_cached_tokens,
        prompt_logprobs=request.take_prompt_logprobs() if request.prompt_logprobs is not None else None,
        embedding=request.take_embedding() if request.embedding is not None else None)
