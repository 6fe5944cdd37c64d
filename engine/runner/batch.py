"""What the runner reads of a scheduled batch. The core's `Request` and `ScheduledBatch`
have these shapes; the runner depends only on the shapes, so it never imports the core."""

from collections.abc import Sequence
from typing import Protocol

from kvdeck.engine.types.sampling_params import SamplingParams


class ScheduledSequence(Protocol):
    request_id: str
    params: SamplingParams
    eos_token_ids: set[int]
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_computed_tokens: int  # tokens whose K/V are already in the cache
    block_table: list[int]  # logical block i -> physical block id
    # Draft tokens verified after the newest token this step (speculative decoding; usually []).
    spec_token_ids: list[int]

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def all_token_ids(self) -> list[int]: ...

    def token_id_at(self, position: int) -> int: ...


class BatchPlan(Protocol):
    """One step: each sequence computes its next `num_new_tokens[i]` tokens."""

    @property
    def requests(self) -> Sequence[ScheduledSequence]: ...

    @property
    def num_new_tokens(self) -> Sequence[int]: ...
