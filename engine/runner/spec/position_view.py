"""A request as the sampler sees it at one position of a speculative chunk: its output so
far plus the drafts before that position, so penalties, min_tokens bans and seeds apply at
each position exactly as they would had the drafts been generated one by one."""

from dataclasses import dataclass

from kvdeck.engine.runner.batch import ScheduledSequence
from kvdeck.engine.types.sampling_params import SamplingParams


@dataclass(slots=True, frozen=True)
class PositionView:
    request: ScheduledSequence
    drafts: tuple[int, ...]  # the drafts emitted before this position, if all were accepted

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def eos_token_ids(self) -> set[int]:
        return self.request.eos_token_ids

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return [*self.request.output_token_ids, *self.drafts]

    @property
    def num_output_tokens(self) -> int:
        return self.request.num_output_tokens + len(self.drafts)

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.request.all_token_ids, *self.drafts]


def position_views(request: ScheduledSequence, drafts: list[int]) -> list[PositionView]:
    """One view per position of a chunk verifying `drafts`: len(drafts) + 1 of them."""
    return [PositionView(request, tuple(drafts[:j])) for j in range(len(drafts) + 1)]
