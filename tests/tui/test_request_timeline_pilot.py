"""The inspector shows why a request is slow: the engine's reason line for a queued request,
the timeline bar and TTFT parts for a finished one (snapshots of the real engine, in-process,
on the tiny Llama)."""

from __future__ import annotations

from rich.console import Console
from textual.app import App, ComposeResult

from kvdeck import LLM, SamplingParams
from kvdeck.tui.widgets.request_inspector import RequestInspector
from kvdeck.tui.widgets.request_timeline_bar import BAR, bar_cells
from tests.tui.conftest import wait_for


class InspectorApp(App):
    def compose(self) -> ComposeResult:
        yield RequestInspector(id="inspector")


def _timeline_text(app: App) -> str:
    """What the widget draws, as plain text at its width."""
    widget = app.query_one("#request-timeline")
    console = Console(width=widget.content_region.width or 80, color_system=None)
    with console.capture() as capture:
        console.print(widget.content)
    return capture.get()


async def test_reason_line_for_a_queued_request_and_bar_for_a_finished_one(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), num_gpu_blocks_override=6, max_model_len=6 * 16,
              enable_prefix_caching=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("big", list(range(10, 10 + 64)), params)
    engine.add_request("queued", list(range(100, 100 + 40)), params)  # no room while big runs
    engine.step()
    app = InspectorApp()
    async with app.run_test(size=(100, 30)) as pilot:
        inspector = app.query_one(RequestInspector)
        assert not app.query_one("#request-timeline").display  # nothing selected
        inspector.show(engine.stats())
        inspector.select("queued")
        assert await wait_for(pilot, lambda: "waiting: needs 3 blocks, 2 free" in _timeline_text(app))
        # "big" decodes a few steps (the last snapshot that shows it), then everything ends.
        for _ in range(4):
            engine.step()
        inspector.show(engine.stats())
        while engine.has_unfinished_requests():
            engine.step()
        inspector.show(engine.stats())
        inspector.select("big")
        assert await wait_for(pilot, lambda: _timeline_text(app).startswith("finished"))
        await pilot.pause()  # laid out at its width
        text = _timeline_text(app)
        lines = text.splitlines()
        width = app.query_one("#request-timeline").content_region.width
        assert lines[1] == BAR * width  # the bar, as wide as the widget
        assert "queued" in lines[2] and "prefill" in lines[2] and "decode" in lines[2]
        assert lines[3].startswith("TTFT ") and "queue" in lines[3] and "first step" in lines[3]


def test_bar_segments_share_the_width_by_time():
    cells = bar_cells([("queued", 1.0), ("prefill", 1.0), ("decode", 8.0), ("preempted", 0.0)], 40)
    assert [phase for phase, _ in cells] == ["queued", "prefill", "decode", "preempted"]
    assert sum(n for _, n in cells) == 40 and all(n >= 1 for _, n in cells)
    assert dict(cells)["decode"] > 4 * dict(cells)["queued"]
