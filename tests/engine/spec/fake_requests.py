"""Requests as the runner reads them, without an engine (sampler and proposer tests)."""

from dataclasses import dataclass, field

from kvdeck.engine.types.sampling_params import SamplingParams


@dataclass(eq=False)
class FakeSequence:
    request_id: str
    params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: set[int] = field(default_factory=set)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)

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
        return self.all_token_ids[position]
