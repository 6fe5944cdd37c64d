"""Turn the last-position logits of a batch into next tokens, one row per request.

Each row follows its own SamplingParams. A request with a `seed` draws its noise from
its own generator, so its tokens do not depend on what else is in the batch.
"""

from dataclasses import dataclass

import torch

from engine.outputs import Logprob
from engine.request import Request


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprobs: dict[int, Logprob] | None = None


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[SampleResult]:
        logits = logits.float()
        want_logprobs = [r.params.logprobs is not None for r in requests]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
        logits = self._apply_penalties(logits, requests)
        greedy = [r.params.greedy for r in requests]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample_random(logits, requests, greedy)
        token_list = tokens.tolist()
        results = [SampleResult(t) for t in token_list]
        if raw_logprobs is not None:
            for i, request in enumerate(requests):
                if want_logprobs[i]:
                    results[i].logprobs = _top_logprobs(
                        raw_logprobs[i], token_list[i], request.params.logprobs or 0
                    )
        return results

    def _apply_penalties(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        for i, request in enumerate(requests):
            p = request.params
            if request.num_output_tokens < p.min_tokens:
                banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(request.eos_token_ids))
                logits[i, [t for t in banned if t < logits.shape[1]]] = float("-inf")
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(request.all_token_ids)), device=logits.device)
                row = logits[i, seen]
                logits[i, seen] = torch.where(
                    row > 0, row / p.repetition_penalty, row * p.repetition_penalty
                )
            if (p.presence_penalty or p.frequency_penalty) and request.output_token_ids:
                out = torch.tensor(request.output_token_ids, device=logits.device)
                counts = torch.bincount(out, minlength=logits.shape[1])[: logits.shape[1]].float()
                logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        return logits

    def _sample_random(
        self, logits: torch.Tensor, requests: list[Request], greedy: list[bool]
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
        unseeded = [i for i, r in enumerate(requests) if r.params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(
                len(unseeded), vocab, device=logits.device
            ).exponential_(generator=self.default_generator)
        for i, request in enumerate(requests):
            if request.params.seed is not None:
                gen = self.request_generators.get(request.request_id)
                if gen is None:
                    gen = torch.Generator(device=logits.device).manual_seed(request.params.seed)
                    self.request_generators[request.request_id] = gen
                noise[i] = torch.empty(vocab, device=logits.device).exponential_(generator=gen)
        sampled = (probs / noise).argmax(dim=-1)
        greedy_mask = torch.tensor(greedy, device=logits.device)
        return torch.where(greedy_mask, logits.argmax(dim=-1), sampled)


def _apply_top_k_top_p_min_p(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    vocab = logits.shape[1]
    top_k = [r.params.top_k if r.params.top_k > 0 else vocab for r in requests]
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


def _top_logprobs(row: torch.Tensor, token_id: int, num: int) -> dict[int, Logprob]:
    result = {token_id: Logprob(token_id, float(row[token_id]))}
    if num > 0:
        values, indices = row.topk(num)
        for value, index in zip(values.tolist(), indices.tolist()):
            result.setdefault(index, Logprob(index, value))
    return result
