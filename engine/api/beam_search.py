"""Beam search over the offline API, the way vLLM's `LLM.beam_search` does it.

Each step runs every live beam of every prompt as one batch of one-token requests (the
beam's tokens as a token-id prompt, `logprobs=2 * beam_width`), extends each beam by each
of its candidates, moves the candidates that end in EOS aside as finished, and keeps the
`beam_width` best of the rest by the length-penalised score. At the end the finished and
the live beams are ranked together by that score.

A beam step re-sends whole sequences, so it relies on the prefix cache: the beams of one
prompt hit the same cached blocks (the prompt's, and those of the tokens they have in
common) and only their last partial block is computed again. The blocks they share are
held by several requests at once (reference counts above one in the block map). With
prefix caching off the results are the same, but every step recomputes every beam whole.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdeck.engine.types.beam_search import (
    BeamSearchOutput,
    BeamSearchParams,
    BeamSearchSequence,
    beam_search_score,
)
from kvdeck.engine.types.outputs import Logprob, RequestOutput
from kvdeck.engine.types.prompts import batch_prompts
from kvdeck.engine.types.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvdeck.engine.api.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

# Runs token-id prompts to completion under one SamplingParams: LLM.generate.
Generate = Callable[[list[list[int]], SamplingParams], list[RequestOutput]]


@dataclass(slots=True)
class BeamSearchInstance:
    """One prompt's search: its live beams and the beams that ended in EOS."""

    beams: list[BeamSearchSequence]
    completed: list[BeamSearchSequence] = field(default_factory=list)


@dataclass(slots=True)
class BeamRanking:
    """What ranks and ends beams: the EOS ids, whether they end a beam, the length penalty."""

    eos_token_ids: frozenset[int]
    ignore_eos: bool
    length_penalty: float

    def score(self, beam: BeamSearchSequence) -> float:
        # With ignore_eos an EOS is a token like any other, and counts in the length (vLLM
        # discounts it even then, ranking such a beam below its peers of the same length).
        eos = frozenset() if self.ignore_eos else self.eos_token_ids
        return beam_search_score(beam.tokens, beam.cum_logprob, eos, self.length_penalty)

    def ends(self, token_id: int) -> bool:
        return not self.ignore_eos and token_id in self.eos_token_ids


def advance(instance: BeamSearchInstance, step_logprobs: Sequence[dict[int, Logprob] | None],
            beam_width: int, ranking: BeamRanking) -> None:
    """Extend each live beam by each candidate of its step (`step_logprobs[i]` for beam i;
    None: the beam's request failed, and the beam is dropped, as vLLM drops it); EOS
    candidates join `completed`, the best `beam_width` others become the live beams."""
    candidates = []
    for beam, logprobs in zip(instance.beams, step_logprobs, strict=True):
        if logprobs is None:
            continue
        for token_id, logprob in logprobs.items():
            extended = BeamSearchSequence(beam.tokens + [token_id], beam.logprobs + [logprobs],
                                          beam.cum_logprob + logprob.logprob)
            if ranking.ends(token_id):
                extended.finish_reason, extended.stop_reason = "stop", token_id
                instance.completed.append(extended)
            else:
                candidates.append(extended)
    candidates.sort(key=ranking.score, reverse=True)
    instance.beams = candidates[:beam_width]


def finish(instance: BeamSearchInstance, beam_width: int, ranking: BeamRanking,
           decode: Callable[[list[int]], str]) -> BeamSearchOutput:
    """The best `beam_width` of the finished and the live beams, best first, with text."""
    for beam in instance.beams:
        beam.finish_reason = "length"
    best = sorted(instance.completed + instance.beams, key=ranking.score, reverse=True)[:beam_width]
    for beam in best:
        beam.text = decode(beam.tokens)
    return BeamSearchOutput(best)


def beam_search(engine: "LLMEngine", generate: Generate, prompts: object, params: BeamSearchParams,
                concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
    """`engine`: the LLMEngine (its front-end encodes and checks the prompts); `generate`
    runs one step's batch. `concurrency_limit`: the most prompts searched at once (all)."""
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
    params.validate()
    if concurrency_limit is not None and (isinstance(concurrency_limit, bool)
                                          or not isinstance(concurrency_limit, int) or concurrency_limit < 1):
        raise ValueError(f"concurrency_limit must be a positive integer or None, got {concurrency_limit!r}")
    step_params = SamplingParams(max_tokens=1, temperature=params.temperature,
                                 logprobs=2 * params.beam_width, detokenize=False)
    prompt_ids = []
    for prompt in batch_prompts(prompts):  # every prompt checked before any step runs
        _, ids = engine.frontend.encode(prompt)
        engine.frontend.limits.check(ids, step_params)
        prompt_ids.append(ids)
    if not engine.info.enable_prefix_caching:
        logger.warning("beam search with prefix caching off: every step recomputes every beam whole")
    ranking = BeamRanking(frozenset(engine.eos_token_ids), params.ignore_eos, params.length_penalty)
    instances = [BeamSearchInstance([BeamSearchSequence(list(ids))]) for ids in prompt_ids]
    limit = concurrency_limit or len(instances)
    for start in range(0, len(instances), limit):
        _search(instances[start : start + limit], generate, step_params, params, ranking,
                engine.max_model_len)
    tokenizer = engine.tokenizer
    return [finish(instance, params.beam_width, ranking, tokenizer.decode) for instance in instances]


def _search(instances: list[BeamSearchInstance], generate: Generate, step_params: SamplingParams,
            params: BeamSearchParams, ranking: BeamRanking, max_model_len: int) -> None:
    for _ in range(params.max_tokens):
        for instance in instances:
            # A beam as long as the model allows has no next step: it ends here.
            for beam in instance.beams:
                if len(beam.tokens) >= max_model_len:
                    beam.finish_reason = "length"
                    instance.completed.append(beam)
            instance.beams = [beam for beam in instance.beams if beam.finish_reason is None]
        live = [beam for instance in instances for beam in instance.beams]
        if not live:
            return
        outputs = iter(generate([beam.tokens for beam in live], step_params))
        for instance in instances:  # the outputs come in the order of `live`
            choices = [next(outputs).outputs[0] for _ in instance.beams]
            advance(instance, [c.logprobs[0] if c.logprobs else None for c in choices],
                    params.beam_width, ranking)
