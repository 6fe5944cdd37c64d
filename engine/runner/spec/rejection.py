"""Exact rejection sampling of draft tokens (Leviathan et al. 2023; Chen et al. 2023).

A speculating request's chunk has k + 1 logit rows: row j is the target's distribution p_j
for the token after draft j (row 0: after the newest real token). Draft x_{j+1} was drawn
from q_j; it is accepted with probability min(1, p_j(x) / q_j(x)). At the first rejection the
token is drawn from norm(max(0, p_j - q_j)) and the chunk ends; when all k are accepted a
bonus token is drawn from p_k. The emitted tokens are then distributed exactly as tokens
sampled one by one from p. An n-gram proposer's q is a point mass on its draft (accept with
probability p(x); on rejection, p without x). Greedy rows accept a draft iff it is the argmax
of the penalised logits, so they emit what non-speculative greedy decoding would.

p is the sampler's own distribution (`Sampler.distribution`: penalties with the drafts
before each position counted as output, min_tokens bans, temperature, top-k/p, min-p). All
rows are processed as one batch; a seeded request draws its noise from its own generator.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvdeck.engine.runner.batch import ScheduledSequence
from kvdeck.engine.runner.sampler import Sampler, SampleResult
from kvdeck.engine.runner.spec.position_view import PositionView, position_views


@dataclass(slots=True)
class _Rows:
    """The chunk rows of a batch of speculating requests, request after request."""

    views: list[PositionView]
    starts: list[int]  # first row of each request
    drafts: list[list[int]]

    @classmethod
    def of(cls, requests: Sequence[ScheduledSequence]) -> "_Rows":
        views, starts, drafts = [], [], []
        for request in requests:
            starts.append(len(views))
            drafts.append(list(request.spec_token_ids))
            views += position_views(request, drafts[-1])
        return cls(views, starts, drafts)


class RejectionSampler:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def verify(self, logits: torch.Tensor, requests: Sequence[ScheduledSequence],
               draft_probs: dict[str, torch.Tensor] | None = None) -> list[list[SampleResult]]:
        """The tokens each request emits: its accepted drafts, then one more.

        logits: [sum(k_i + 1), vocab], request after request. draft_probs: request id ->
        [k_i, vocab] probabilities its drafts were drawn from (absent: point masses).
        """
        rows = _Rows.of(requests)
        greedy = [r.params.greedy for r in requests]
        penalised, probs = self.sampler.distribution(logits, rows.views, with_probs=not all(greedy))
        targets = penalised.argmax(dim=-1)
        if probs is None:
            picked = recovered_list = targets.tolist()
            accepted = [False] * len(picked)
        else:
            accept, recovered = self._random_rows(probs, requests, rows, draft_probs or {})
            # One device-to-host copy for the step's decisions.
            host = torch.stack([targets, accept.long(), recovered]).tolist()
            picked, accepted = host[0], [bool(a) for a in host[1]]
            recovered_list = host[2]
        emitted: list[list[int]] = []
        for i, drafts in enumerate(rows.drafts):
            start = rows.starts[i]
            tokens: list[int] = []
            for j, draft in enumerate(drafts):
                ok = draft == picked[start + j] if greedy[i] else accepted[start + j]
                if not ok:
                    break
                tokens.append(draft)
            else:
                j = len(drafts)  # every draft accepted: the bonus row
            tokens.append(picked[start + j] if greedy[i] else recovered_list[start + j])
            emitted.append(tokens)
        return self._results(logits, rows, emitted)

    def _random_rows(self, probs: torch.Tensor, requests: Sequence[ScheduledSequence], rows: _Rows,
                     draft_probs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row: whether its draft is accepted, and the token drawn if the chunk ends there
        (from the residual max(0, p - q), or from p on the bonus row)."""
        device = probs.device
        num_rows, vocab = probs.shape
        q = torch.zeros_like(probs)  # bonus rows keep q = 0: their residual is p itself
        draft_rows, draft_tokens = [], []
        for request, start, drafts in zip(requests, rows.starts, rows.drafts):
            if not drafts:
                continue
            span = slice(start, start + len(drafts))
            given = draft_probs.get(request.request_id)
            if given is not None:
                q[span] = given.to(device=device, dtype=q.dtype)
            else:
                q[span].scatter_(1, torch.tensor(drafts, device=device)[:, None], 1.0)
            draft_rows += range(span.start, span.stop)
            draft_tokens += drafts
        accept = torch.zeros(num_rows, dtype=torch.bool, device=device)
        uniform, noise = self._draws(requests, rows, num_rows, vocab, device)
        if draft_rows:
            index = torch.tensor(draft_rows, device=device)
            tokens = torch.tensor(draft_tokens, device=device)
            p_x, q_x = probs[index, tokens], q[index, tokens]
            # u < p/q without dividing: q_x > 0 for a token that was actually drawn from q.
            accept[index] = uniform[index] * q_x < p_x
        residual = (probs - q).clamp_(min=0.0)
        empty = residual.sum(dim=-1, keepdim=True) <= 0  # p == q: never rejected; keep p for safety
        residual = torch.where(empty, probs, residual)
        recovered = (residual / noise).argmax(dim=-1)
        return accept, recovered

    def _draws(self, requests: Sequence[ScheduledSequence], rows: _Rows, num_rows: int, vocab: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A uniform and an Exp(1) noise row per chunk row: seeded requests from their own
        generator (so their tokens do not depend on the batch), the rest from the default."""
        uniform = torch.empty(num_rows, device=device)
        noise = torch.empty(num_rows, vocab, device=device)
        shared: list[int] = []
        for request, start, drafts in zip(requests, rows.starts, rows.drafts):
            span = range(start, start + len(drafts) + 1)
            generator = None if request.params.greedy else self.sampler.generator(request)
            if generator is None:
                shared += span
                continue
            uniform[span.start : span.stop].uniform_(generator=generator)
            noise[span.start : span.stop].exponential_(generator=generator)
        if shared:
            default = self.sampler.default_generator
            uniform[shared] = torch.empty(len(shared), device=device).uniform_(generator=default)
            noise[shared] = torch.empty(len(shared), vocab, device=device).exponential_(generator=default)
        return uniform, noise

    def _results(self, logits: torch.Tensor, rows: _Rows,
                 emitted: list[list[int]]) -> list[list[SampleResult]]:
        """SampleResults with logprobs (under the raw logits of each token's own row)."""
        flat_rows, flat_views, flat_tokens = [], [], []
        for start, tokens in zip(rows.starts, emitted):
            for j, token in enumerate(tokens):
                flat_rows.append(start + j)
                flat_views.append(rows.views[start + j])
                flat_tokens.append(token)
        want = any(v.params.logprobs is not None for v in flat_views)
        entries = (self.sampler.logprobs(logits[flat_rows], flat_views, flat_tokens) if want
                   else [None] * len(flat_tokens))
        results, cursor = [], 0
        for tokens in emitted:
            results.append([SampleResult(t, entries[cursor + j]) for j, t in enumerate(tokens)])
            cursor += len(tokens)
        return results
