"""The gain policy: how many of each request's drafts are worth verifying this step.

A step of B decoding requests emits B tokens for cost(B). Verifying a draft token adds a row
(cost(B + 1)) and, with probability p, a token. p is the chance that the token and every
draft before it are accepted: suffix decoding estimates it from its tree's counts (scaled by
how well the request's estimates have held), other proposers from the request's recent
acceptance rate (p_j = rate^j). Every draft token of the batch is a candidate; taken in
order of p, the policy keeps the count that maximises expected tokens per second, and none
unless that beats plain decoding by `min_gain`. So speculation turns itself off where
acceptance is poor, and as the batch grows (each row then costs a plain step's share).

A request left without drafts for `explore_after` steps forgets its record and is tried
again: what it writes may have turned repetitive.
"""

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PRIOR_RATE = 0.5  # a request's acceptance rate before it has been measured...
PRIOR_WEIGHT = 2.0  # ...worth this many draft tokens
MIN_GAIN = 0.03  # expected tokens per second must beat plain decoding by this much
HISTORY = 8  # verify steps kept per request for its estimate


@dataclass(slots=True)
class AcceptanceRecord:
    """A request's recent verifies: (drafted, accepted, predicted accepted) each."""

    verifies: deque[tuple[int, int, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    steps_without_drafts: int = 0

    def rate(self) -> float:
        """Accepted per drafted token, with the prior."""
        drafted = sum(v[0] for v in self.verifies)
        accepted = sum(v[1] for v in self.verifies)
        return (accepted + PRIOR_RATE * PRIOR_WEIGHT) / (drafted + PRIOR_WEIGHT)

    def calibration(self) -> float:
        """Accepted per predicted token (the proposer's estimates' bias), with a prior of 1."""
        predicted = sum(v[2] for v in self.verifies)
        accepted = sum(v[1] for v in self.verifies)
        return (accepted + PRIOR_WEIGHT) / (predicted + PRIOR_WEIGHT)

    def acceptance(self, num_drafts: int, estimates: Sequence[float] | None) -> list[float]:
        """p_j for each draft position: non-increasing, in [0, 1]."""
        if estimates is not None:
            scale = self.calibration()
            raw = [p * scale for p in estimates[:num_drafts]]
        else:
            rate = self.rate()
            raw = [rate ** (j + 1) for j in range(num_drafts)]
        out, ceiling = [], 1.0
        for p in raw:
            ceiling = min(ceiling, max(0.0, p))
            out.append(ceiling)
        return out


def best_draft_lengths(offers: Sequence[Sequence[float]], batch_rows: int,
                       cost: Callable[[int], float], max_rows: int | None = None,
                       min_gain: float = MIN_GAIN) -> tuple[list[int], float]:
    """How many drafts of each offer to verify, and the expected speed-up over plain decoding.
    `offers[i][j]`: the chance request i's draft j is accepted (non-increasing in j);
    `batch_rows`: the step's rows without drafts; `cost(rows)`: a step's cost;
    `max_rows`: the most rows a step may have (None: no limit)."""
    candidates = sorted(((p, j, i) for i, probs in enumerate(offers) for j, p in enumerate(probs)),
                        key=lambda c: (-c[0], c[1]))
    plain = batch_rows / cost(batch_rows)
    best_count, best_rate, tokens = 0, plain * (1.0 + min_gain), float(batch_rows)
    for count, (p, _, _) in enumerate(candidates, start=1):
        rows = batch_rows + count
        if max_rows is not None and rows > max_rows:
            break
        tokens += p
        rate = tokens / cost(rows)
        if rate > best_rate:
            best_count, best_rate = count, rate
    lengths = [0] * len(offers)
    for _, j, i in candidates[:best_count]:
        lengths[i] = max(lengths[i], j + 1)
    return lengths, (best_rate / plain if best_count else 1.0)
