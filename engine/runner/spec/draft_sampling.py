"""Drawing a draft model's proposals: from the same processed distribution the target's
sampler uses (penalties, temperature, top-k/p, min-p), so q is close to p and drafts are
accepted often. Greedy requests take the argmax. A seeded request's draws come from a
generator of its own, seeded apart from the target's (the rejection test must not reuse the
draft's noise)."""

from collections.abc import Sequence

import torch

from kvdeck.engine.runner.batch import ScheduledSequence
from kvdeck.engine.runner.sampler import Sampler

_DRAFT_SEED_SALT = 0x5DEECE66D  # any fixed odd constant: keeps the draft's stream apart


class DraftSampler:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.generators: dict[str, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, requests: Sequence[ScheduledSequence],
               ) -> tuple[list[int], torch.Tensor]:
        """One draft token per row, and the distribution q each was drawn from [rows, vocab]."""
        greedy = [r.params.greedy for r in requests]
        penalised, probs = self.sampler.distribution(logits, requests, with_probs=not all(greedy))
        if probs is None:  # greedy verification ignores q
            return penalised.argmax(dim=-1).tolist(), penalised
        noise = torch.empty_like(probs)
        shared = []
        for row, request in enumerate(requests):
            if request.params.seed is None:
                shared.append(row)
            else:
                noise[row].exponential_(generator=self._generator(request))
        if shared:
            noise[shared] = torch.empty(len(shared), probs.shape[1], device=probs.device).exponential_(
                generator=self.sampler.default_generator)
        drawn = (probs / noise).argmax(dim=-1)
        tokens = torch.where(torch.tensor(greedy, device=probs.device), penalised.argmax(dim=-1), drawn)
        return tokens.tolist(), probs

    def _generator(self, request: ScheduledSequence) -> torch.Generator:
        gen = self.generators.get(request.request_id)
        if gen is None:
            seed = (request.params.seed ^ _DRAFT_SEED_SALT) & 0x7FFF_FFFF_FFFF_FFFF
            gen = self.generators[request.request_id] = torch.Generator(
                device=self.sampler.device).manual_seed(seed)
        return gen

    def forget(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
