"""Turn the last-position logits of a batch into next tokens, one row per request.

Each row follows its own SamplingParams. A request with a `seed` draws its noise from
its own generator, so its tokens do not depend on what else is in the batch.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvdeck.engine.runner.batch import ScheduledSequence
from kvdeck.engine.types.outputs import Logprob
from kvdeck.kernels.reference.token_bitmask import apply_token_bitmask_


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprobs: dict[int, Logprob] | None = None


@dataclass(slots=True)
class DeviceSamples:
    """A batch's samples still on the device: token ids by row, and what logprobs need."""

    tokens: torch.Tensor
    raw_logprobs: torch.Tensor | None = None
    want_logprobs: list[int] = field(default_factory=list)  # rows that asked for logprobs
    tops: list[int] = field(default_factory=list)  # their top-n


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def _generator(self, request: ScheduledSequence, device: torch.device) -> torch.Generator:
        gen = self.request_generators.get(request.request_id)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(request.params.seed)
            self.request_generators[request.request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, requests: Sequence[ScheduledSequence],
               masks: tuple[list[int], torch.Tensor] | None = None,
               greedy: torch.Tensor | None = None) -> list[SampleResult]:
        """`masks`: (rows, int32 bitmask) of the rows a grammar constrains; a constrained
        row samples only what its grammar allows (logprobs stay the model's own). `greedy`:
        the logits' argmax made already (by a decode graph), taken when every row is greedy."""
        samples = self.sample_on_device(logits, requests, masks, greedy)
        return self.to_results(samples, samples.tokens.tolist())  # the step's one device-to-host wait

    def sample_on_device(self, logits: torch.Tensor, requests: Sequence[ScheduledSequence],
                         masks: tuple[list[int], torch.Tensor] | None = None,
                         greedy: torch.Tensor | None = None) -> "DeviceSamples":
        """`sample` without waiting for the device: the token ids stay where they were drawn
        (async scheduling feeds them to the next step there)."""
        if masks is None and all(r.params.plain_greedy for r in requests):
            # Each row's token is the argmax of its logits as they are (most batches): one
            # flag read a row, no copy, no look at the rows' other settings.
            return DeviceSamples(greedy if greedy is not None else logits.to(torch.float32).argmax(dim=-1))
        if (greedy is not None and masks is None and not _changes_logits(requests)
                and all(r.params.greedy and r.params.logprobs is None for r in requests)):
            return DeviceSamples(greedy)  # the argmax of these logits, made in the graph
        # A copy where this method changes logits in place (masks, penalties), so the
        # caller's tensor stays as it was (the runner may sample rows again, one by one).
        logits = logits.to(torch.float32, copy=masks is not None or _changes_logits(requests))
        want_logprobs = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        allowed = None
        if masks is not None:
            rows = torch.tensor(masks[0], device=logits.device)
            allowed = apply_token_bitmask_(logits[rows], masks[1])
            logits[rows] = allowed
        logits = self._apply_penalties(logits, requests)
        if allowed is not None:
            # A min_tokens ban may remove the only tokens a grammar allows (its end): the
            # grammar wins, so such a row falls back to its grammar's choice alone.
            dead = torch.isinf(logits[rows]).all(dim=-1)
            if dead.any():
                logits[rows[dead]] = allowed[dead]
        greedy = [r.params.greedy for r in requests]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample_random(logits, requests, greedy)
        tops = [requests[i].params.logprobs or 0 for i in want_logprobs]
        return DeviceSamples(tokens, raw_logprobs, want_logprobs, tops)

    @staticmethod
    def to_results(samples: "DeviceSamples", token_list: list[int]) -> list[SampleResult]:
        """The samples on the host, given their token ids there (logprobs are copied now)."""
        results = [SampleResult(t) for t in token_list]
        if samples.raw_logprobs is not None:
            rows = samples.want_logprobs
            for i, entry in zip(rows, top_logprobs(samples.raw_logprobs, rows, [token_list[i] for i in rows],
                                                    samples.tops)):
                results[i].logprobs = entry
        return results

    def _apply_penalties(self, logits: torch.Tensor, requests: Sequence[ScheduledSequence]) -> torch.Tensor:
        """logit_bias, min_tokens bans, then repetition, presence and frequency penalties
        (vLLM's and OpenAI's definitions), gathered over the batch into one update of each
        kind."""
        vocab = logits.shape[1]
        banned: list[tuple[int, int]] = []
        biased: list[tuple[int, int, float]] = []  # (row, token, bias)
        repeated: list[tuple[int, int, float]] = []  # (row, token, penalty)
        counted: list[tuple[int, int, float]] = []  # (row, token, amount to subtract)
        for row, request in enumerate(requests):
            p = request.params
            if p.logit_bias:
                biased += [(row, t, bias) for t, bias in p.logit_bias.items() if t < vocab]
            if request.num_output_tokens < p.min_tokens:
                ends = list(p.stop_token_ids) + ([] if p.ignore_eos else list(request.eos_token_ids))
                banned += [(row, t) for t in ends if t < vocab]
            if p.repetition_penalty != 1.0:
                repeated += [(row, t, p.repetition_penalty) for t in set(request.all_token_ids)]
            if (p.presence_penalty or p.frequency_penalty) and request.output_token_ids:
                counted += [(row, t, p.frequency_penalty * n + p.presence_penalty)
                            for t, n in Counter(request.output_token_ids).items()]
        device = logits.device
        if biased:
            rows, toks, bias = _columns(biased, device)
            logits.index_put_((rows, toks), bias, accumulate=True)
        if banned:
            rows, toks = torch.tensor(banned, device=device).unbind(1)
            logits[rows, toks] = float("-inf")
        if repeated:
            rows, toks, penalty = _columns(repeated, device)
            values = logits[rows, toks]
            logits[rows, toks] = torch.where(values > 0, values / penalty, values * penalty)
        if counted:
            rows, toks, amount = _columns(counted, device)
            logits.index_put_((rows, toks), -amount, accumulate=True)
        return logits

    def _sample_random(
        self, logits: torch.Tensor, requests: Sequence[ScheduledSequence], greedy: list[bool]
    ) -> torch.Tensor:
        vocab = logits.shape[1]
        temperature = torch.tensor(
            [1.0 if g else r.params.temperature for r, g in zip(requests, greedy)],
            device=logits.device,
        )
        scaled = logits / temperature[:, None]
        scaled = _apply_top_k_top_p_min_p(scaled, requests)
        probs = torch.softmax(scaled, dim=-1)
        # Gumbel-style draw: argmax(p / Exp(1)) samples from p, one noise row per request.
        noise = torch.empty_like(probs)
        # Every seeded row's generator exists before any noise is drawn, so a failure here
        # leaves no generator advanced (the runner may re-sample the rows one by one).
        seeded = [(i, self._generator(r, logits.device)) for i, r in enumerate(requests)
                  if r.params.seed is not None]
        unseeded = [i for i, r in enumerate(requests) if r.params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(
                len(unseeded), vocab, device=logits.device
            ).exponential_(generator=self.default_generator)
        for i, gen in seeded:
            noise[i] = torch.empty(vocab, device=logits.device).exponential_(generator=gen)
        sampled = (probs / noise).argmax(dim=-1)
        greedy_mask = torch.tensor(greedy, device=logits.device)
        return torch.where(greedy_mask, logits.argmax(dim=-1), sampled)

    # ---- what speculative decoding verifies drafts against (engine/runner/spec/) ----------
    def distribution(self, logits: torch.Tensor, requests: Sequence[ScheduledSequence],
                     with_probs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What `sample` draws each row from: the penalised logits (a greedy row takes their
        argmax) and, unless `with_probs` is False (all rows greedy), the probabilities after
        temperature, top-k, top-p and min-p (temperature 1 for greedy rows). The caller's
        logits are left as they are."""
        logits = self._apply_penalties(logits.float().clone(), requests)
        if not with_probs:
            return logits, None
        temperature = torch.tensor([1.0 if r.params.greedy else r.params.temperature for r in requests],
                                   device=logits.device)
        scaled = _apply_top_k_top_p_min_p(logits / temperature[:, None], requests)
        return logits, torch.softmax(scaled, dim=-1)

    def logprobs(self, logits: torch.Tensor, requests: Sequence[ScheduledSequence],
                 tokens: list[int]) -> list[dict[int, Logprob] | None]:
        """Each row's token's logprob under the raw logits, with the row's top-n, for the rows
        whose request asked for logprobs (None for the others)."""
        entries: list[dict[int, Logprob] | None] = [None] * len(requests)
        rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        if rows:
            raw = torch.log_softmax(logits[rows].float(), dim=-1)
            tops = [requests[i].params.logprobs or 0 for i in rows]
            for i, entry in zip(rows, top_logprobs(raw, list(range(len(rows))), [tokens[i] for i in rows],
                                                    tops)):
                entries[i] = entry
        return entries

    def generator(self, request: ScheduledSequence) -> torch.Generator | None:
        """The request's own generator (None: it has no seed and draws from the default one)."""
        return None if request.params.seed is None else self._generator(request, self.device)


def _changes_logits(requests: Sequence[ScheduledSequence]) -> bool:
    """Whether _apply_penalties will write into the logits."""
    return any(r.params.has_penalties or r.params.logit_bias or r.num_output_tokens < r.params.min_tokens
               for r in requests)


def _apply_top_k_top_p_min_p(logits: torch.Tensor, requests: Sequence[ScheduledSequence]) -> torch.Tensor:
    vocab = logits.shape[1]
    top_k = [min(r.params.top_k, vocab) if r.params.top_k > 0 else vocab for r in requests]
    top_p = [r.params.top_p for r in requests]
    min_p = [r.params.min_p for r in requests]
    if all(k >= vocab for k in top_k) and all(p >= 1.0 for p in top_p) and not any(min_p):
        return logits
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    remove = ranks >= torch.tensor(top_k, device=device)[:, None]
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token once the mass before it already reaches top_p (the first always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    remove |= mass_before >= torch.tensor(top_p, device=device)[:, None]
    remove |= probs < torch.tensor(min_p, device=device)[:, None] * probs[:, :1]
    remove[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _columns(entries: list[tuple[int, int, float]], device) -> tuple[torch.Tensor, ...]:
    """(row, token, value) triples as a row index, a token index and a float tensor."""
    rows, toks, values = zip(*entries)
    return (torch.tensor(rows, device=device), torch.tensor(toks, device=device),
            torch.tensor(values, dtype=torch.float32, device=device))


def top_logprobs(logprobs: torch.Tensor, rows: list[int], tokens: list[int],
                  tops: list[int]) -> list[dict[int, Logprob]]:
    """For each row: the sampled token's logprob and the row's `top` most likely tokens
    (the sampled one first, as OpenAI lists it), copied to the host once for all rows."""
    device = logprobs.device
    picked = logprobs[rows]
    chosen = picked.gather(1, torch.tensor(tokens, device=device)[:, None])
    ranks = ((picked > chosen).sum(dim=1) + 1).tolist()
    values, indices = picked.topk(max(tops), dim=-1)
    entries = []
    for token, logprob, rank, row_values, row_indices, top in zip(
            tokens, chosen.squeeze(1).tolist(), ranks, values.tolist(), indices.tolist(), tops):
        entry = {token: Logprob(token, logprob, rank=rank)}
        for place, (value, index) in enumerate(zip(row_values[:top], row_indices[:top]), 1):
            entry.setdefault(index, Logprob(index, value, rank=place))
        entries.append(entry)
    return entries
