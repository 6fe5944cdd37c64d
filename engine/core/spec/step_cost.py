"""What a decode step costs by its number of rows, learned from the engine's own steps: the
price side of speculation's bargain (each draft token is one more row in the verify step).

Each decode-only step's wall time is folded into a moving average for its row count. A row
count not seen often enough is estimated from the nearest one that has been, scaled by a
linear prior (`prior_slope`: each extra row costs that fraction of a one-row step; on this
project's CPU decoder stack a five-row verify took about 1.5 one-row steps, so 0.125). The
prior is optimistic on purpose: a row count is only learned once it has been tried.
"""

from dataclasses import dataclass, field

DEFAULT_PRIOR_SLOPE = 0.125
MIN_SAMPLES = 3  # a row count's average is trusted after this many steps
SMOOTHING = 0.2  # weight of the newest step in a row count's moving average


@dataclass(slots=True)
class _RowCost:
    seconds: float = 0.0
    samples: int = 0


@dataclass(slots=True)
class StepCostModel:
    prior_slope: float = DEFAULT_PRIOR_SLOPE
    by_rows: dict[int, _RowCost] = field(default_factory=dict)

    def observe(self, rows: int, seconds: float) -> None:
        """A decode-only step of `rows` rows took `seconds` (steps with prefill are not
        observed: their cost is the prompt's, not the drafts')."""
        if rows <= 0 or seconds <= 0.0:
            return
        cost = self.by_rows.setdefault(rows, _RowCost())
        cost.seconds = seconds if cost.samples == 0 else \
            (1.0 - SMOOTHING) * cost.seconds + SMOOTHING * seconds
        cost.samples += 1

    def relative(self, rows: int) -> float:
        """The cost of a `rows`-row step in units of a one-row step under the prior."""
        return 1.0 + self.prior_slope * (rows - 1)

    def cost(self, rows: int) -> float:
        """A `rows`-row step's estimated seconds (relative units while nothing is learned)."""
        known = [(r, c.seconds) for r, c in self.by_rows.items() if c.samples >= MIN_SAMPLES]
        if not known:
            return self.relative(rows)
        # More rows never cost less: a noisy average below a smaller step's is lifted to it.
        floor = max((s for r, s in known if r < rows), default=0.0)
        exact = self.by_rows.get(rows)
        if exact is not None and exact.samples >= MIN_SAMPLES:
            return max(exact.seconds, floor)
        # The nearest learned row count, scaled by the prior's ratio.
        nearest, seconds = min(known, key=lambda rc: (abs(rc[0] - rows), rc[0]))
        return max(seconds * self.relative(rows) / self.relative(nearest), floor)
