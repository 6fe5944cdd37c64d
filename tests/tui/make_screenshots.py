"""Take the README's screenshots: the chat beside the dashboard during a load burst.

    python -m tests.tui.make_screenshots [--model DIR] [--out assets/screenshots]

Runs the real engine (CPU is fine) on the given model, or on the bundled demo model, or,
when neither exists, on a tiny random Llama built on the fly. Writes SVG files.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from textual.widgets import DataTable

from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.engine_factory import real_client_factory
from kvdeck.tui.load_generator import LoadSpec
from kvdeck.tui.widgets.chat_input import ChatInput

REPO = Path(__file__).resolve().parents[2]
# The TUI's own pool (four full contexts: 128 blocks for the demo model) and its default
# burst: 32 requests of 8 prompt + 20 output blocks need 896, so the burst shows prefix
# sharing (a leader goes first), a queue and, as outputs grow, preemption.
ENGINE = dict(max_model_len=512)
BURST = LoadSpec(num_requests=32, prompt_tokens=128, output_tokens=320, shared_prefix_tokens=32,
                 seed=7)  # long enough to be running still when the shots are taken


async def until(pilot, condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await pilot.pause(0.05)
    return False


async def shoot(model: str, name: str, out_dir: Path, size: tuple[int, int], prefix: str,
                with_latency: bool) -> list[Path]:
    settings = ChatSettings(temperature=0.8, max_tokens=48, seed=1)
    with tempfile.TemporaryDirectory() as chats:
        app = KvdeckApp(real_client_factory(model, dict(ENGINE)), name,
                        transcript_dir=Path(chats), chat_settings=settings)
        written = []
        async with app.run_test(size=size) as pilot:
            if not await until(pilot, lambda: app.engine_ready, 180):
                raise RuntimeError(f"the engine did not start: {app.client.health()}")
            chat = app.screen.chat
            chat.query_one("#prompt", ChatInput).focus()
            await pilot.press(*"What does the block map show?")
            await pilot.press("enter")
            await until(pilot, lambda: not chat.generating, 60)
            app._fire_load(BURST)
            fired = time.monotonic()
            state = app.dashboard_state
            if not await until(pilot, lambda: state.stats is not None
                               and state.stats.num_running >= 8
                               and (state.stats.num_preemptions > 0
                                    or state.stats.kv_cache_usage > 0.9), 180):
                raise RuntimeError("the burst never filled the KV pool")
            await pilot.pause(0.5)  # a few decode steps: block tables grow, ITL points appear
            table = app.screen.query_one("#request-table", DataTable)
            if table.row_count > 1:
                table.focus()
                await pilot.press("down")
                await pilot.pause(0.3)
            print(f"{time.monotonic() - fired:.1f} s after the burst: running "
                  f"{state.stats.num_running}, finished {len(state.ended)}", flush=True)
            if not state.stats.num_running:
                raise RuntimeError("the burst ended before the shot: give it longer outputs")
            path = out_dir / f"{prefix}-load-burst.svg"
            app.save_screenshot(str(path))
            written.append(path)
            if with_latency:
                await pilot.press("f3")
                dashboard = app.screen.dashboard
                if not await until(pilot, lambda: dashboard.active_tab == "tab-latency", 10):
                    raise RuntimeError("the latency tab did not open")
                await pilot.pause(1.0)  # the plots redraw on their own timer
                path = out_dir / f"{prefix}-latency.svg"
                app.save_screenshot(str(path))
                written.append(path)
            await app.load.stop()
        return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=REPO / "assets" / "screenshots")
    args = parser.parse_args()
    model = args.model
    if model is None and (REPO / "assets" / "demo_model" / "config.json").is_file():
        model = str(REPO / "assets" / "demo_model")
    if model is None:
        from tests.model_factory import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny-llama", "llama"))
    args.out.mkdir(parents=True, exist_ok=True)
    for size, prefix, latency in (((160, 48), "kvdeck-160x48", True),
                                  ((80, 24), "kvdeck-80x24", False)):
        name = "kvdeck-demo" if args.model is None else Path(model).name
        for path in asyncio.run(shoot(model, name, args.out, size, prefix, latency)):
            print(path)


if __name__ == "__main__":
    main()
