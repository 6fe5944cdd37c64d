"""Suffix decoding (vLLM's "suffix" method, SuffixDecoding from Arctic Inference): drafts from
suffix trees with frequency counts, over the request's own prompt and output and over
recent requests' outputs (suffix_cache.py), of a length that varies per request and step.

Each step a request's trees catch up with the tokens it gained (only those are added), then
the longest suffixes of its last max_tree_depth tokens are matched and the most frequent
continuation followed while its estimated probability stays at least min_token_prob, for
at most min(k, max_spec_factor x match length) tokens. A request's output is offered to the
global tree as it grows and once more, complete, when it finishes.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from kvdeck.engine.core.request import Request
from kvdeck.engine.core.spec.suffix_cache import SuffixCache
from kvdeck.engine.types.speculative import SpeculativeConfig


@dataclass(slots=True)
class _Tracked:
    request: Request
    num_outputs: int = 0  # output tokens already in the trees


class SuffixProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.max_tree_depth = config.suffix_decoding_max_tree_depth
        self.max_spec_factor = config.suffix_decoding_max_spec_factor
        self.min_token_prob = config.suffix_decoding_min_token_prob
        self.cache = SuffixCache(self.max_tree_depth, config.suffix_decoding_max_cached_requests)
        self.tracked: dict[str, _Tracked] = {}
        # The last proposals' estimated acceptance per draft token, by request id (the gain
        # policy weighs each token by it).
        self.last_probs: dict[str, list[float]] = {}

    def propose(self, requests: Sequence[Request], num_drafts: Sequence[int]) -> list[list[int]]:
        """Up to num_drafts[i] tokens for requests[i] ([] where nothing matches)."""
        out = []
        self.last_probs = {}
        for request, k in zip(requests, num_drafts):
            self._sync(request)
            start = max(0, request.num_tokens - self.max_tree_depth)
            context = list(request.token_ids_between(start, request.num_tokens))
            draft = self.cache.speculate(request.request_id, context, k, self.max_spec_factor,
                                         self.min_token_prob)
            out.append(draft.token_ids)
            self.last_probs[request.request_id] = draft.probs
        return out

    def draft_estimates(self) -> dict[str, list[float]]:
        return self.last_probs

    def _sync(self, request: Request) -> None:
        tracked = self.tracked.get(request.request_id)
        if tracked is None:
            tracked = self.tracked[request.request_id] = _Tracked(request)
            self.cache.start(request.request_id, list(request.prompt_token_ids))
        self._add_new_outputs(tracked)

    def _add_new_outputs(self, tracked: _Tracked) -> None:
        new = tracked.request.output_token_ids[tracked.num_outputs:]
        if new:
            self.cache.add_output(tracked.request.request_id, new)
            tracked.num_outputs += len(new)

    def draft_probs(self) -> None:
        return None  # drafts are point masses, as a lookup's

    def on_verified(self, request: Request) -> None:
        pass  # the trees catch up with the accepted tokens on the next call

    def on_preempted(self, request: Request) -> None:
        pass  # tokens survive preemption; only K/V is lost

    def forget(self, request_id: str) -> None:
        tracked = self.tracked.pop(request_id, None)
        if tracked is None:
            return
        # The last steps' tokens, which no propose saw, still belong in the cached output.
        self._add_new_outputs(tracked)
        self.cache.stop(request_id)

    def reset_cache(self) -> None:
        self.cache.clear()

    def pool_stats(self) -> None:
        return None  # no model, no KV

    def sequence_stats(self, request_id: str) -> None:
        return None
