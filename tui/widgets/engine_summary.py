"""The dashboard's headline figures: queues, KV gauge and history, the KV pool's format,
the LoRA adapters in use and the slots they sit in, throughput, last batch."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.widgets.lora_slots import LoRASlots

GAUGE_WIDTH = 20
BARS = " ▁▂▃▄▅▆▇█"


def kv_gauge(usage: float, width: int = GAUGE_WIDTH) -> Text:
    usage = min(max(usage, 0.0), 1.0)
    filled = round(usage * width)
    colour = "#3cb44b" if usage < 0.7 else "#f58231" if usage < 0.9 else "#e6194b"
    text = Text("KV ")
    text.append("█" * filled, style=colour)
    text.append("░" * (width - filled), style="#7a7a7a")
    text.append(f" {usage * 100:5.1f}%", style="bold")
    return text


def history_text(history: Iterable[float], width: int) -> Text:
    """The newest `width` samples of a 0..1 series as one line of eighth blocks."""
    samples = list(history)[-width:] if width > 0 else []
    # Any non-zero usage gets at least the lowest bar, so a lightly used pool is visible.
    bars = "".join(BARS[min(8, max(1 if v > 0 else 0, round(v * 8)))] for v in samples)
    return Text(bars.rjust(max(width, 0), " "), style="#4363d8")


def metrics_queue_line(state: DashboardState) -> Text:
    """A server seen only through /metrics: its queues (vLLM's gauges)."""
    view = state.metrics
    text = Text()
    if view is None:
        text.append(f"waiting for {state.source_label or 'the server'}'s /metrics…",
                    style="italic")
        return text
    for label, value, style in (("running", view.num_running, "bold #3cb44b"),
                                ("waiting", view.num_waiting, "bold #f58231")):
        text.append(f"{label} ")
        text.append("–" if value is None else f"{value:.0f}", style=style)
        text.append("  ")
    if view.preemptions_per_s is not None:
        text.append(f"preemptions {view.preemptions_per_s:.2f}/s")
    return text


def queue_line(state: DashboardState) -> Text:
    stats = state.stats
    text = Text()
    if not state.connected:
        text.append("disconnected: ", style="bold #e6194b")
        text.append("the last figures, greyed; reconnecting…  ", style="italic")
    if stats is None and state.source == "openai":
        return text.append_text(metrics_queue_line(state))
    if stats is None:
        text.append("waiting for engine statistics…", style="italic")
        return text
    for label, value, style in (
        ("running", stats.num_running, "bold #3cb44b"),
        ("waiting", stats.num_waiting, "bold #f58231"),
        ("preempted", stats.num_preempted, "bold #e6194b"),
        ("finished", stats.num_requests_finished, "bold"),
    ):
        text.append(f"{label} ")
        text.append(str(value), style=style)
        text.append("  ")
    if stats.num_swapped:  # waiting with their K/V in host swap space (KV tiers)
        text.append("swapped ")
        text.append(str(stats.num_swapped), style="bold #f032e6")
        text.append("  ")
    text.append(f"preemptions {stats.num_preemptions}")
    return text


def kv_line(state: DashboardState) -> Text:
    stats = state.stats
    if stats is None and state.metrics is not None:
        usage = state.metrics.kv_cache_usage
        text = kv_gauge(usage or 0.0)
        text.append(" (vllm:kv_cache_usage_perc; blocks are not exported)")
        return text
    if stats is None:
        return kv_gauge(0.0)
    text = kv_gauge(stats.kv_cache_usage)
    used = stats.num_blocks - stats.num_free_blocks
    text.append(f" {used}/{stats.num_blocks} blocks · {stats.num_cached_blocks} cached")
    if state.max_model_len:  # the pool's size in the unit a user thinks in
        fits = stats.num_blocks * stats.block_size // state.max_model_len
        text.append(f" · fits {fits}×{state.max_model_len} tok")
    return text


def byte_size(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} B"
    if num_bytes < 1024**2:
        return f"{num_bytes / 1024:.1f} KiB"
    return f"{num_bytes / 1024**2:.1f} MiB"


def kv_format_line(state: DashboardState) -> Text:
    """What a block is (the KV dtype, its bytes) and how many tokens the pool holds; with a
    sliding window, the blocks it has released. Empty where the snapshot does not say
    (a vLLM server, an older kvdeck)."""
    stats = state.stats
    text = Text()
    if stats is None or not stats.kv_cache_dtype:
        return text
    text.append("KV ")
    text.append(stats.kv_cache_dtype, style="bold")
    text.append(f" · {byte_size(stats.kv_bytes_per_block)}/block of {stats.block_size} tok"
                f" · pool holds {stats.kv_cache_tokens:,} tok")
    if stats.num_window_released_blocks:
        text.append(f" · {stats.num_window_released_blocks:,} blocks slid out of the window")
    return text


_RUNNING = ("prefilling", "decoding")


def lora_line(state: DashboardState) -> Text:
    """The LoRA adapters the engine's requests run under, with how many run in the batch and
    how many wait (at most max_loras distinct ones share a step); empty with none."""
    stats = state.stats
    text = Text()
    if stats is None:
        return text
    running: dict[str, int] = {}
    waiting: dict[str, int] = {}
    for request in stats.requests:
        if request.lora_name is not None:
            counts = running if request.state in _RUNNING else waiting
            counts[request.lora_name] = counts.get(request.lora_name, 0) + 1
    if not running and not waiting:
        return text
    text.append("LoRA ")
    for label, counts, style in (("running", running, "bold #3cb44b"),
                                 ("waiting", waiting, "bold #f58231")):
        if counts:
            text.append(f"{label} ")
            text.append(", ".join(f"{name}×{n}" for name, n in sorted(counts.items())), style=style)
            text.append("  ")
    text.append(f"· {len(running)} in the batch", style="dim")
    return text


def throughput_line(state: DashboardState) -> Text:
    stats = state.stats
    text = Text()
    text.append(f"{state.tokens_per_s:.1f}", style="bold")
    text.append(" tok/s · prefix hit ")
    rate = state.prefix_hit_rate
    text.append("n/a" if rate is None else f"{rate * 100:.1f}%", style="bold")
    if stats is not None and stats.num_running == 0 and stats.num_waiting == 0:
        text.append(" · ")
        text.append("idle", style="bold")  # not the last step's figures, long gone
    elif stats is not None:
        text.append(" · step ")
        text.append(f"{stats.last_step_prefill_tokens}", style="bold #4363d8")
        text.append(" prefill + ")
        text.append(f"{stats.last_step_decode_tokens}", style="bold #3cb44b")
        text.append(f" decode, {stats.last_step_num_seqs} seqs, "
                    f"{stats.last_step_duration_s * 1000:.0f} ms")
    return text


class HistoryLine(Static):
    """The KV usage history as one line of bars, as wide as the widget (redrawn on resize)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.values: list[float] = []

    def set_values(self, values: Iterable[float]) -> None:
        self.values = list(values)
        self.refresh()

    def render(self) -> Text:
        return history_text(self.values, self.size.width)


class EngineSummary(Vertical):
    DEFAULT_CSS = """
    EngineSummary { height: auto; }
    EngineSummary > Static { height: auto; }
    EngineSummary #kv-row { height: 1; }
    EngineSummary #kv-gauge { width: auto; }
    EngineSummary #kv-history { width: 1fr; margin-left: 2; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="queues")
        with Horizontal(id="kv-row"):
            yield Static(id="kv-gauge")
            yield HistoryLine(id="kv-history")
        yield Static(id="kv-format")
        adapters = Static(id="lora-adapters")
        adapters.display = False  # shown while requests run under adapters
        yield adapters
        yield LoRASlots(id="lora-slots")  # with LoRA on: each device slot's adapter
        yield Static(id="throughput")

    def show(self, state: DashboardState) -> None:
        self.query_one("#queues", Static).update(queue_line(state))
        self.query_one("#kv-gauge", Static).update(kv_line(state))
        self.query_one(HistoryLine).set_values(v for _, v in state.kv_history)
        kv_format = self.query_one("#kv-format", Static)
        kv_format.update(line := kv_format_line(state))
        kv_format.display = bool(line.plain)
        adapters = self.query_one("#lora-adapters", Static)
        adapters.update(line := lora_line(state))
        adapters.display = bool(line.plain)
        self.query_one(LoRASlots).show(state.stats)
        self.query_one("#throughput", Static).update(throughput_line(state))
