"""N-gram prompt lookup (vLLM's "ngram" method): propose the tokens that followed the most
recent earlier occurrence of the sequence's last n tokens, trying n from prompt_lookup_max
down to prompt_lookup_min, over the prompt and the output so far.

Vectorised over the batch with numpy: each request's tokens live in a buffer of its own
(only new tokens are copied in each step), the batch is stacked into one matrix, and one
comparison per n-gram offset finds every match of every request at once.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvdeck.engine.core.request import Request

_PAD = -1  # never a token id


@dataclass(slots=True)
class _TokenBuffer:
    tokens: np.ndarray
    length: int = 0

    def sync(self, request: Request) -> None:
        """Append the tokens the request gained since the last call."""
        total = request.num_tokens
        if total <= self.length:
            return
        if total > len(self.tokens):
            grown = np.full(max(total, 2 * len(self.tokens)), _PAD, dtype=np.int64)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        prompt = request.num_prompt_tokens
        if self.length < prompt:
            self.tokens[self.length : prompt] = request.prompt_token_ids[self.length :]
            self.length = prompt
        self.tokens[self.length : total] = request.output_token_ids[self.length - prompt :]
        self.length = total


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.buffers: dict[str, _TokenBuffer] = {}

    def propose(self, requests: Sequence[Request], num_drafts: Sequence[int]) -> list[list[int]]:
        """Up to num_drafts[i] tokens for requests[i] ([] where nothing matches)."""
        if not requests:
            return []
        for request in requests:
            buffer = self.buffers.get(request.request_id)
            if buffer is None:
                buffer = self.buffers[request.request_id] = _TokenBuffer(
                    np.full(max(64, 2 * request.num_tokens), _PAD, dtype=np.int64))
            buffer.sync(request)
        lengths = np.array([self.buffers[r.request_id].length for r in requests])
        width = int(lengths.max())
        tokens = np.full((len(requests), width), _PAD, dtype=np.int64)
        for row, request in enumerate(requests):
            tokens[row, : lengths[row]] = self.buffers[request.request_id].tokens[: lengths[row]]
        ends = self._match_ends(tokens, lengths)
        out: list[list[int]] = []
        for row, (end, k) in enumerate(zip(ends.tolist(), num_drafts)):
            out.append([] if end < 0 else tokens[row, end + 1 : min(end + 1 + k, lengths[row])].tolist())
        return out

    def _match_ends(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Per row: the end position of the latest earlier occurrence of its longest matching
        suffix (n in [min_n, max_n]), or -1."""
        rows = np.arange(len(tokens))
        width = tokens.shape[1]
        positions = np.arange(width)[None, :]
        # Position e ends a candidate occurrence if a token follows it (e < length - 1): the
        # suffix itself ends at length - 1 and is never its own match.
        matching = positions < (lengths - 1)[:, None]
        best = np.full(len(tokens), -1)
        for back in range(min(self.max_n, width)):
            # Does the token `back` places before e equal the one `back` places before the end?
            wanted = tokens[rows, np.maximum(lengths - 1 - back, 0)]
            shifted = np.full_like(tokens, _PAD)
            shifted[:, back:] = tokens[:, : width - back]
            matching &= (shifted == wanted[:, None]) & (lengths > back)[:, None]
            n = back + 1
            if n < self.min_n:
                continue
            found = matching.any(axis=1)
            latest = width - 1 - np.argmax(matching[:, ::-1], axis=1)
            best = np.where(found, latest, best)  # a longer n overrides a shorter one
        return best

    def draft_probs(self) -> None:
        return None  # a lookup is certain of its drafts: q is a point mass

    def on_verified(self, request: Request) -> None:
        pass  # the buffer catches up with the new tokens on the next call

    def on_preempted(self, request: Request) -> None:
        pass  # tokens survive preemption; only K/V is lost

    def forget(self, request_id: str) -> None:
        self.buffers.pop(request_id, None)

    def pool_stats(self) -> None:
        return None  # no model, no KV

    def sequence_stats(self, request_id: str) -> None:
        return None
