"""Parallel sampling (n > 1) in the front-end, as vLLM v1's ParentRequest does it.

One caller's request of n choices is n engine requests (its children) that the core
schedules like any others; prefix caching lets them share the prompt's full blocks once
the first has computed them (the block map shows those blocks shared). The caller sees one
request: one id, outputs that carry their choice's index, finished once every choice is,
and one abort for all of them.
"""

from dataclasses import dataclass, replace

from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.sampling_params import INT64_MIN, SamplingParams


@dataclass(slots=True)
class ParentRequest:
    request_id: str
    params: SamplingParams
    child_ids: list[str]
    num_finished: int = 0

    @classmethod
    def of(cls, request_id: str, params: SamplingParams) -> "ParentRequest":
        # One choice keeps the caller's id for its engine request (what stats and logs show).
        ids = [request_id] if params.n == 1 else [f"{request_id}-{i}" for i in range(params.n)]
        return cls(request_id, params, ids)

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.child_ids)

    def child_params(self, index: int) -> SamplingParams:
        """Choice `index`'s own params (n=1). A seed is offset by the index (wrapping around
        the 64-bit range), so the choices differ while the whole request stays reproducible."""
        seed = self.params.seed
        return replace(self.params, n=1, seed=None if seed is None else _offset_seed(seed, index))

    def output(self, index: int, child: RequestOutput) -> RequestOutput:
        """The caller's output for one child's: that choice's completion under its index,
        under the caller's id, finished once every choice is."""
        if child.finished:
            self.num_finished += 1
        if len(self.child_ids) == 1:
            return child
        return replace(child, request_id=self.request_id,
                       outputs=[replace(child.outputs[0], index=index)], finished=self.finished)


def _offset_seed(seed: int, index: int) -> int:
    return (seed + index - INT64_MIN) % 2**64 + INT64_MIN


def merge_choices(finals: list[RequestOutput]) -> RequestOutput:
    """Each choice's final output (by index) as one output with n completions."""
    if len(finals) == 1:
        return finals[0]
    first = finals[0]
    return replace(first, outputs=[out.outputs[0] for out in finals],
                   finished=all(out.outputs[0].finish_reason is not None for out in finals),
                   delta_text="", delta_token_ids=[])
