"""What the runner reads of a scheduled batch. The core's `Request` and `ScheduledBatch`
have these shapes; the runner depends only on the shapes, so it never imports the core."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvdeck.engine.types.sampling_params import SamplingParams

# Async scheduling: an output token sampled by the step in flight, not yet on the host. It
# stands at the end of a request's output until that step's samples arrive; the runner takes
# such a token from the previous step's samples on the device.
PLACEHOLDER = -1


class ScheduledSequence(Protocol):
    request_id: str
    params: SamplingParams
    eos_token_ids: set[int]
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    num_computed_tokens: int  # tokens whose K/V are already in the cache
    block_table: list[int]  # logical block i -> physical block id (the first KV group's)
    block_tables: list[list[int]]  # every KV group's table
    table_epoch: int  # bumped whenever a table changes other than by appending
    # Draft tokens verified after the newest token this step (speculative decoding; usually []).
    spec_token_ids: list[int]
    long_rope: bool  # LongRoPE: rotate with the long factors

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def all_token_ids(self) -> list[int]: ...

    def token_id_at(self, position: int) -> int: ...


class BatchPlan(Protocol):
    """One step: each sequence computes its next `num_new_tokens[i]` tokens. A plan may also
    say `num_plain_decodes`: its first rows are decodes of their newest token alone (the
    runner then reads only their computed length and that token)."""

    @property
    def requests(self) -> Sequence[ScheduledSequence]: ...

    @property
    def num_new_tokens(self) -> Sequence[int]: ...


@dataclass(slots=True)
class TokenMasks:
    """Grammar bitmasks for some of the batch's sampling requests: row i of `bitmask`
    (int32 [rows, ceil(vocab / 32)]) constrains batch.requests[batch_index[i]]."""

    batch_index: list[int]
    bitmask: np.ndarray
