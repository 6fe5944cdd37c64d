"""The engine dashboard: headline figures, block map with inspector, latency graphs.

It redraws from the app's DashboardState on its own timer (REFRESH_HZ), independent of how
fast snapshots arrive; the engine runs in another process, so drawing never slows it.
Attached to servers (`kvdeck attach`) it adds a Servers tab; on a server that exports no
block table (vLLM) the Blocks tab says so instead of drawing an empty map, and while the
server is unreachable the last figures stay, greyed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Grid, Vertical
from textual.widgets import Static, TabbedContent, TabPane, Tabs

from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.request_colours import RequestColours
from kvdeck.tui.widgets.block_map import BlockMap, legend_parts
from kvdeck.tui.widgets.engine_summary import EngineSummary
from kvdeck.tui.widgets.flow_text import FlowText
from kvdeck.tui.widgets.latency_plot import TimeSeriesPlot
from kvdeck.tui.widgets.request_inspector import RequestInspector
from kvdeck.tui.widgets.server_table import ServerTable
from kvdeck.tui.widgets.tier_strip import TierStrip

if TYPE_CHECKING:
    from kvdeck.engine.types.spec_stats import SpecDecodeStats
    from kvdeck.tui.attached_servers import AttachedServers

REFRESH_HZ = 12
PLOT_REFRESH_S = 0.5  # plots are costlier to draw and change slowly


SPEC_OFF = ("Speculative decoding is off. Turn it on in the engine settings (ctrl+e: automatic, "
            "n-gram lookup, suffix decoding or a draft model) or with --speculative-config; the "
            "acceptance rate and the drafts accepted per step are graphed here.")
NO_BLOCK_MAP = ("{label} exports no block table: the block map and the request inspector "
                "need a kvdeck engine (kvdeck --serve, or kvdeck itself). What its /metrics "
                "say is above, in the Latency tab and in the Servers tab.")


def spec_policy_text(spec: SpecDecodeStats) -> str:
    """One line on what speculation does and, under the gain policy, what it last decided."""
    if spec.draft_policy != "gain":
        return (f"{spec.method}: up to {spec.num_speculative_tokens} drafts a step, every one "
                "verified (a request pauses while its acceptance is poor)")
    last = (f"last step: drafts kept, expecting {spec.last_step_expected_speedup:.2f}x plain decoding"
            if spec.last_step_expected_speedup > 1.0 else "last step: no draft worth its row")
    return (f"{spec.method}: drafts kept only where they pay · a step's extra row costs "
            f"+{spec.extra_row_cost:.0%} of a one-row step · {last}")


class Dashboard(Vertical):
    DEFAULT_CSS = """
    Dashboard #no-block-map { display: none; padding: 1 2; }
    Dashboard.-no-block-map #no-block-map { display: block; }
    Dashboard.-no-block-map #block-map, Dashboard.-no-block-map #legend,
    Dashboard.-no-block-map #tier-strip,
    Dashboard.-no-block-map #inspector { display: none; }
    Dashboard #spec-off { padding: 1 2; }
    Dashboard.-speculating #spec-off { display: none; }
    Dashboard #spec-plots { display: none; grid-size: 1 2; height: 1fr; }
    Dashboard.-speculating #spec-plots { display: block; }
    Dashboard #spec-policy { display: none; height: auto; padding: 0 1; }
    Dashboard.-speculating #spec-policy { display: block; }
    Dashboard.-disconnected EngineSummary, Dashboard.-disconnected #block-map,
    Dashboard.-disconnected #inspector, Dashboard.-disconnected #plots { text-opacity: 45%; }
    """

    def __init__(self, state: DashboardState, servers: AttachedServers | None = None, *,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = state
        self.servers = servers
        self._servers_version = -1
        self.colours = RequestColours()  # one colour per request, in the map and the table
        self._seen_version = -1
        self._plotted: tuple[int, int] = (-1, -1)
        self._plot_age = 0.0
        self.redraws = 0  # how many times new stats were drawn (tests check the refresh rate)
        self.ticks = 0  # refresh timer ticks: they keep coming while a server stalls
        self._legend_key: tuple[int, bool] | None = None  # (block size, speculation on)

    def compose(self) -> ComposeResult:
        yield EngineSummary(id="summary")
        with TabbedContent(id="dashboard-tabs"):
            with TabPane("Blocks", id="tab-blocks"):
                yield BlockMap(self.colours, id="block-map")
                yield TierStrip(id="tier-strip")  # host swap, host and disk prefix tiers
                yield FlowText([legend_parts()], id="legend")  # breaks between entries
                yield RequestInspector(self.colours, id="inspector")
                yield Static(id="no-block-map")
            with TabPane("Latency", id="tab-latency"):
                with Grid(id="plots"):
                    yield TimeSeriesPlot("TTFT", "ms", id="plot-ttft")
                    yield TimeSeriesPlot("Inter-token latency", "ms", id="plot-itl")
                    yield TimeSeriesPlot("Output tokens/s", "tok/s", lines=True,
                                         id="plot-throughput")
                    yield TimeSeriesPlot("KV cache usage", "%", lines=True, y_max=100.0,
                                         id="plot-kv")
            with TabPane("Speculation", id="tab-spec"):
                yield Static(SPEC_OFF, id="spec-off")
                yield Static("", id="spec-policy")
                with Grid(id="spec-plots"):
                    yield TimeSeriesPlot("Draft acceptance", "%", lines=True, y_max=100.0,
                                         id="plot-acceptance")
                    yield TimeSeriesPlot("Drafts accepted per verify step", "tokens",
                                         lines=True, id="plot-accepted-per-step")
            if self.servers is not None:
                with TabPane("Servers", id="tab-servers"):
                    yield ServerTable(self.servers, id="server-table")

    def on_mount(self) -> None:
        self.set_interval(1 / REFRESH_HZ, self.redraw)
        self.redraw()

    def redraw(self) -> None:
        state = self.state
        self.ticks += 1
        self.set_class(not state.connected, "-disconnected")
        no_map = state.source == "openai"
        if no_map != self.has_class("-no-block-map"):
            self.set_class(no_map, "-no-block-map")
            self.query_one("#no-block-map", Static).update(
                NO_BLOCK_MAP.format(label=state.source_label or "This server"))
        if self.servers is not None and self.servers.version != self._servers_version:
            self._servers_version = self.servers.version
            self.query_one(ServerTable).show()
        if state.version != self._seen_version:
            self._seen_version = state.version
            self.redraws += 1
            self.query_one(EngineSummary).show(state)
            self.set_class(state.stats is not None and state.stats.spec is not None,
                           "-speculating")
            if state.stats is not None and state.stats.spec is not None:
                self.query_one("#spec-policy", Static).update(spec_policy_text(state.stats.spec))
            if state.stats is not None:
                self.query_one(BlockMap).update_stats(state.stats)
                self.query_one(TierStrip).show(state.stats)
                self.query_one(RequestInspector).show(state.stats, state.ended)
                legend = (state.stats.block_size, state.stats.spec is not None)
                if legend != self._legend_key:
                    self._legend_key = legend
                    self.query_one("#legend", FlowText).set_rows([legend_parts(*legend)])
        self._plot_age += 1 / REFRESH_HZ
        tabs = self.query_one(TabbedContent)
        if tabs.active in ("tab-latency", "tab-spec") and self._plot_age >= PLOT_REFRESH_S:
            self.redraw_plots()

    def redraw_plots(self, force: bool = False) -> None:
        state = self.state
        key = (state.version, state.latency_version)
        if key == self._plotted and not force:
            return
        self._plotted = key
        self._plot_age = 0.0
        now = state.latest_time()  # one window for all four: events line up
        self.query_one("#plot-ttft", TimeSeriesPlot).set_points(state.ttft_points, now)
        self.query_one("#plot-itl", TimeSeriesPlot).set_points(state.itl_points, now)
        self.query_one("#plot-throughput", TimeSeriesPlot).set_points(state.throughput_history,
                                                                      now)
        self.query_one("#plot-kv", TimeSeriesPlot).set_points(
            ((t, v * 100) for t, v in state.kv_history), now
        )
        self.query_one("#plot-acceptance", TimeSeriesPlot).set_points(
            ((t, v * 100) for t, v in state.acceptance_history), now)
        self.query_one("#plot-accepted-per-step", TimeSeriesPlot).set_points(
            state.accepted_per_step_history, now)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id in ("tab-latency", "tab-spec"):
            self.redraw_plots(force=True)

    def on_request_inspector_selected(self, event: RequestInspector.Selected) -> None:
        self.query_one(BlockMap).selected_request = event.request_id

    def on_block_map_block_clicked(self, event: BlockMap.BlockClicked) -> None:
        self.query_one(RequestInspector).select(event.owner)

    @property
    def active_tab(self) -> str:
        return self.query_one(TabbedContent).active

    def show_tab(self, tab_id: str) -> None:
        tabs = self.query_one(TabbedContent)
        focused = self.app.focused
        pane = tabs.active_pane
        if focused is not None and pane is not None and pane in focused.ancestors:
            # TabbedContent goes back to the tab that holds the focus: move it to the tab bar.
            tabs.query_one(Tabs).focus()
        tabs.active = tab_id
