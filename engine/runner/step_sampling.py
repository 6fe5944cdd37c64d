"""Sampling a step's logits, failure by failure: a batch the sampler or the rejection
sampler cannot serve is retried row by row, so a request that breaks it fails by itself and
the others still get their tokens; a failure no single row explains is the engine's, raised."""

import logging

import torch

from kvdeck.engine.runner.batch import ScheduledSequence, TokenMasks
from kvdeck.engine.runner.sampler import Sampler, SampleResult
from kvdeck.engine.runner.spec.rejection import RejectionSampler

logger = logging.getLogger(__name__)


class StepSampler:
    def __init__(self, sampler: Sampler, device: torch.device) -> None:
        self.sampler = sampler
        self.rejection = RejectionSampler(sampler)
        self.device = device

    def verify(self, logits: torch.Tensor, requests: list[ScheduledSequence],
                draft_probs: dict[str, torch.Tensor] | None,
                ) -> tuple[list[list[SampleResult] | None], dict[int, str]]:
        """Verify the speculating requests together; if that fails, each alone (as `sample`)."""
        try:
            return list(self.rejection.verify(logits, requests, draft_probs)), {}
        except Exception as batch_error:
            verified: list[list[SampleResult] | None] = []
            failed: dict[int, str] = {}
            start = 0
            for row, request in enumerate(requests):
                width = len(request.spec_token_ids) + 1
                try:
                    verified += self.rejection.verify(logits[start : start + width], [request], draft_probs)
                except Exception as exc:
                    verified.append(None)
                    failed[row] = f"{type(exc).__name__}: {exc}"
                start += width
            if len(failed) == len(requests) > 1:
                raise batch_error
            logger.error("verifying drafts failed for %d of %d requests: %s", len(failed), len(requests),
                         "; ".join(failed.values()))
            return verified, failed

    def mask_rows(self, token_masks: TokenMasks | None,
                   sample_batch_index: list[int]) -> tuple[list[int], torch.Tensor] | None:
        """The bitmask rows as rows of the sampled logits (batch index -> sample row)."""
        if token_masks is None or not token_masks.batch_index:
            return None
        row_of = {index: row for row, index in enumerate(sample_batch_index)}
        rows = [row_of[index] for index in token_masks.batch_index]
        return rows, torch.from_numpy(token_masks.bitmask).to(self.device, non_blocking=True)

    def sample(self, logits: torch.Tensor, requests: list[ScheduledSequence],
                masks: tuple[list[int], torch.Tensor] | None = None, greedy: torch.Tensor | None = None,
                ) -> tuple[list[SampleResult | None], dict[int, str]]:
        """Sample the batch; if that fails, sample each row alone, so that a request the
        sampler cannot serve fails by itself and the others still get their tokens. A failure
        no single row explains (every row fails) is the engine's, and is raised."""
        try:
            if greedy is not None:
                return list(self.sampler.sample(logits, requests, masks, greedy)), {}
            return list(self.sampler.sample(logits, requests, masks)), {}
        except Exception as batch_error:
            samples: list[SampleResult | None] = []
            failed: dict[int, str] = {}
            mask_of = dict(zip(masks[0], masks[1])) if masks is not None else {}
            for row, request in enumerate(requests):
                mask = ([0], mask_of[row][None]) if row in mask_of else None
                try:
                    samples.append(self.sampler.sample(logits[row : row + 1], [request], mask)[0])
                except Exception as exc:
                    samples.append(None)
                    failed[row] = f"{type(exc).__name__}: {exc}"
            if len(failed) == len(requests) > 1:
                raise batch_error
            logger.error("sampling failed for %d of %d requests: %s", len(failed), len(requests),
                         "; ".join(failed.values()))
            return samples, failed
