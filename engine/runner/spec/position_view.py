"""A request as the sampler sees it at one position of a speculative chunk: its output so
far plus the drafts before that position, so penalties, min_tokens bans and seeds apply at
each position exactly as they would had the drafts been generated one by one."""

from collections.abc import Sequence
from dataclasses import dataclass

from kvdeck.engine.runner.batch import ScheduledSequence
from kvdeck.engine.types.sampling_params import SamplingParams


class ExtendedSequence:
    """A request seen with some tokens appended after its own (the drafts before a verify
    position; a draft model's pending drafts): what the sampler and the runner read of it.
    Subclasses hold `request` and say what is appended (`appended`)."""

    __slots__ = ()
    request: ScheduledSequence

    @property
    def appended(self) -> Sequence[int]:
        raise NotImplementedError

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
        return [*self.request.output_token_ids, *self.appended]

    @property
    def num_output_tokens(self) -> int:
        return self.request.num_output_tokens + len(self.appended)

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.request.all_token_ids, *self.appended]


@dataclass(slots=True, frozen=True)
class PositionView(ExtendedSequence):
    request: ScheduledSequence
    drafts: tuple[int, ...]  # the drafts emitted before this position, if all were accepted

    @property
    def appended(self) -> Sequence[int]:
        return self.drafts


def position_views(request: ScheduledSequence, drafts: list[int]) -> list[PositionView]:
    """One view per position of a chunk verifying `drafts`: len(drafts) + 1 of them."""
    return [PositionView(request, tuple(drafts[:j])) for j in range(len(drafts) + 1)]
