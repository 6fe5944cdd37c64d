"""The KV tiers behind the device pool, as the block map's second strip shows them: host swap
space (swap preemption), and the prefix cache's host-memory and disk tiers. Pure data from an
EngineStats snapshot (no Textual); a tier the engine has not configured (size 0) is left out.
Also the per-request line the inspector shows: where its prompt's cached tokens came from and
what its swaps cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats, RequestStats

SWAP_COLOUR = "#f032e6"
HOST_COLOUR = "#4363d8"
DISK_COLOUR = "#9a6324"


@dataclass(slots=True)
class TierRow:
    name: str  # "host swap" | "host cache" | "disk cache"
    used: int  # blocks held
    total: int  # blocks it has room for
    colour: str
    detail: str  # hit rate, or what swapping did

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total else 0.0


def _rate(hits: int, queries: int) -> str:
    if not queries:
        return "no lookups yet"
    return f"hit rate {hits / queries:.0%} ({hits:,} of {queries:,} prompt tokens)"


def tier_rows(stats: EngineStats) -> list[TierRow]:
    rows = []
    if stats.host_swap_blocks_total:
        rows.append(TierRow("host swap", stats.host_swap_blocks_used, stats.host_swap_blocks_total,
                            SWAP_COLOUR, f"{stats.num_swapped} swapped out · {stats.swap_outs_total:,} "
                            f"out, {stats.swap_ins_total:,} in ({stats.swap_seconds_total * 1000:,.0f} ms "
                            "of copies)"))
    if stats.host_cache_blocks_total:
        rows.append(TierRow("host cache", stats.host_cache_blocks, stats.host_cache_blocks_total,
                            HOST_COLOUR, _rate(stats.host_cache_hits, stats.host_cache_queries)))
    if stats.disk_cache_blocks_total:
        rows.append(TierRow("disk cache", stats.disk_cache_blocks, stats.disk_cache_blocks_total,
                            DISK_COLOUR, _rate(stats.disk_cache_hits, stats.disk_cache_queries)))
    return rows


def bar_cells(row: TierRow, width: int) -> int:
    """Filled cells of a `width`-cell bar: at least one while the tier holds anything."""
    if row.used <= 0 or row.total <= 0 or width <= 0:
        return 0
    return min(width, max(1, round(row.fraction * width)))


def request_tiers_text(request: RequestStats) -> Text:
    """Where the request's cached prompt tokens came from (device pool, host, disk) and what
    its swaps cost; empty when neither tier nor swap touched it."""
    text = Text()
    host, disk = request.num_host_cached_tokens, request.num_disk_cached_tokens
    if host or disk:
        text.append("prompt from cache: ", style="bold")
        text.append(f"device {request.num_cached_tokens:,} · ")
        text.append(f"host {host:,}", style=HOST_COLOUR)
        text.append(" · ")
        text.append(f"disk {disk:,}", style=DISK_COLOUR)
        text.append(" tok\n")
    swaps = request.timeline.swaps if request.timeline is not None else []
    if swaps:
        nbytes = sum(s[1] for s in swaps)
        seconds = sum(s[2] for s in swaps)
        times = {1: "once", 2: "twice"}.get(len(swaps), f"{len(swaps)} times")
        text.append(f"swapped {times}: ", style=f"bold {SWAP_COLOUR}")
        text.append(f"{nbytes / (1 << 20):,.1f} MiB out and back, {seconds * 1000:,.1f} ms of copies\n")
    return text
