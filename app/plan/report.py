"""What the planner says: per engine choice, TTFT and ITL percentiles, the KV peak,
preemptions, concurrency and throughput; a verdict for the base choice; against a recording,
the predicted figures beside the recorded ones. A rich table, or JSON."""

import math
from dataclasses import asdict, dataclass, field

from kvdeck.app.plan.simulate import SimResult

PERCENTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(slots=True)
class ChoiceSummary:
    label: str
    num_blocks: int
    block_size: int
    kv_cache_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    max_model_len: int
    requests: int
    finished: int
    rejected: int
    ttft_s: dict[str, float | None]
    itl_s: dict[str, float | None]
    peak_blocks: int
    peak_kv_usage: float
    preemptions: int
    max_running: int
    steps: int
    duration_s: float
    output_tokens_per_s: float
    prefix_hit_rate: float
    pool_note: str = ""
    cost_model: str = ""


def summarize(result: SimResult, cost_description: str) -> ChoiceSummary:
    choice = result.choice
    ttfts = [r.ttft_s for r in result.requests if r.ttft_s is not None]
    gaps = [gap for r in result.requests for gap in r.token_gaps_s]
    return ChoiceSummary(
        label=choice.label, num_blocks=choice.num_blocks, block_size=choice.block_size,
        kv_cache_dtype=choice.kv_cache_dtype, max_num_seqs=choice.max_num_seqs,
        max_num_batched_tokens=choice.max_num_batched_tokens,
        enable_prefix_caching=choice.enable_prefix_caching, max_model_len=choice.max_model_len,
        requests=len(result.requests) + len(result.rejected),
        finished=sum(r.finished_s is not None for r in result.requests),
        rejected=len(result.rejected),
        ttft_s={f"p{q}": percentile(ttfts, q) for q in PERCENTILES},
        itl_s={f"p{q}": percentile(gaps, q) for q in PERCENTILES},
        peak_blocks=result.peak_blocks, peak_kv_usage=result.peak_blocks / choice.num_blocks,
        preemptions=result.num_preemptions, max_running=result.max_running,
        steps=result.num_steps, duration_s=result.duration_s,
        output_tokens_per_s=result.generated_tokens / result.duration_s if result.duration_s else 0.0,
        prefix_hit_rate=(result.prefix_cache_hits / result.prefix_cache_queries
                         if result.prefix_cache_queries else 0.0),
        pool_note=choice.pool_note, cost_model=cost_description)


@dataclass(slots=True)
class Comparison:
    """A predicted figure beside the recorded one."""

    name: str
    recorded: float | None
    predicted: float | None
    tolerance: float | None  # relative; 0: must be equal; None: shown only

    @property
    def error(self) -> float | None:
        if self.recorded is None or self.predicted is None or not self.recorded:
            return None
        return (self.predicted - self.recorded) / self.recorded

    @property
    def ok(self) -> bool | None:
        if self.tolerance is None or self.error is None:
            return None
        return abs(self.error) <= self.tolerance + 1e-12


@dataclass(slots=True)
class PlanReport:
    workload: str
    summaries: list[ChoiceSummary]
    verdict: str = ""
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        data = asdict(self)
        for item, comparison in zip(data["comparisons"], self.comparisons):
            item["error"], item["ok"] = comparison.error, comparison.ok
        return data


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def _short(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.01:
        return f"{value * 1e3:.1f}ms"
    return f"{value * 1e3:.0f}ms" if value < 1 else f"{value:.1f}s"


def _triple(values: dict[str, float | None]) -> str:
    """p50/p90/p99, each in its own unit: "23ms/27ms/2.5s"."""
    return "/".join(_short(v) for v in values.values())


def render(report: PlanReport, console) -> None:
    """Print the report as rich tables on `console` (a rich.console.Console)."""
    from rich.table import Table

    console.print(f"[bold]workload[/]: {report.workload}")
    from rich import box

    table = Table(title="kvdeck plan (TTFT, ITL: p50/p90/p99; hit: prefix cache)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1), collapse_padding=True)  # fits 100 columns
    for column in ("choice", "pool", "TTFT", "ITL", "KV peak", "preempt", "max run", "tok/s",
                   "hit"):
        table.add_column(column, justify="left" if column == "choice" else "right", no_wrap=True)
    for i, s in enumerate(report.summaries):
        table.add_row(
            f"try {i}" if i else s.label, f"{s.num_blocks}x{s.block_size} {s.kv_cache_dtype}",
            _triple(s.ttft_s),
            _triple(s.itl_s), f"{s.peak_blocks} ({s.peak_kv_usage:.0%})", str(s.preemptions),
            str(s.max_running), f"{s.output_tokens_per_s:.0f}", f"{s.prefix_hit_rate:.0%}")
    console.print(table)
    for i, s in enumerate(report.summaries[1:], 1):  # the --try labels, which may be long
        console.print(f"try {i}: {s.label}")
    for s in report.summaries:
        if s.pool_note and (s is report.summaries[0] or s.pool_note != report.summaries[0].pool_note):
            console.print(f"pool ({s.label}): {s.pool_note}")
    console.print(f"step cost: {report.summaries[0].cost_model}")
    if report.comparisons:
        compare = Table(title="prediction vs recording", title_justify="left")
        for column in ("figure", "recorded", "predicted", "error", "target"):
            compare.add_column(column, justify="left" if column == "figure" else "right")
        for c in report.comparisons:
            seconds = c.name.endswith("(s)")  # a time; else a count

            def fmt(v: float | None, seconds: bool = seconds) -> str:
                return "-" if v is None else (_s(v) if seconds else f"{v:g}")

            target = "-" if c.tolerance is None else ("exact" if c.tolerance == 0 else f"±{c.tolerance:.0%}")
            mark = {True: " ok", False: " MISS", None: ""}[c.ok]
            compare.add_row(c.name, fmt(c.recorded), fmt(c.predicted),
                            "-" if c.error is None else f"{c.error:+.1%}", target + mark)
        console.print(compare)
    for note in report.notes:
        console.print(f"note: {note}")
    if report.verdict:
        console.print(f"[bold]{report.verdict}[/]", soft_wrap=True)  # one line, for grep


def verdict(summary: ChoiceSummary, users: int | None, context: int | None,
            blocks_per_context: int | None, ttft_slo_s: float | None) -> str:
    """One line: fits / does not fit, and why."""
    p99 = summary.ttft_s["p99"]
    holds = f"the pool holds {summary.num_blocks / blocks_per_context:.1f} full {context}-token contexts" \
        if blocks_per_context else f"the pool holds {summary.num_blocks} blocks"
    who = f"{users} users" if users else f"{summary.requests} requests"
    if summary.rejected:
        return (f"does not fit: {summary.rejected} requests are longer than max_model_len "
                f"{summary.max_model_len}")
    if summary.preemptions:
        times = "once" if summary.preemptions == 1 else f"{summary.preemptions} times"
        return f"does not fit: {holds}; {who} preempt {times}; p99 TTFT {_s(p99)}"
    if ttft_slo_s is not None and p99 is not None and p99 > ttft_slo_s:
        return f"does not fit: p99 TTFT {_s(p99)} > the {_s(ttft_slo_s)} target ({holds}; no preemptions)"
    tail = f"no preemptions, p99 TTFT {_s(p99)}, p50 ITL {_s(summary.itl_s['p50'])}"
    if blocks_per_context and users and summary.num_blocks < users * blocks_per_context:
        return (f"fits this workload ({tail}), but {holds}: {who} all at full context at once "
                "would preempt")
    return f"fits: {holds} for {who}; {tail}"
