"""Take the README's `kvdeck attach` screenshots: attached to a kvdeck server during a load
burst, and to two vLLM-style replicas (the fake in tests/attach, with moving metrics).

    python -m tests.attach.make_screenshots [--out assets/screenshots]

Starts `kvdeck --serve --model demo` on loopback for the first (CPU is fine).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from pathlib import Path

from textual.widgets import Input

from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.attached_servers import AttachedServers
from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.load_generator import LoadSpec
from tests.attach import fake_vllm
from tests.serve.conftest import free_port, start_server, stop_server
from tests.tui.make_screenshots import REPO, until

BURST = LoadSpec(num_requests=12, prompt_tokens=96, output_tokens=96, shared_prefix_tokens=32,
                 seed=7)
SIZE = (160, 48)


def attached(urls: list[str], chats: str) -> KvdeckApp:
    servers = AttachedServers(urls)
    return KvdeckApp(servers.client_factory(), urls[0], transcript_dir=Path(chats),
                     chat_settings=ChatSettings(temperature=0.8, max_tokens=48, seed=1),
                     servers=servers)


async def shoot_kvdeck(url: str, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as chats:
        app = attached([url], chats)
        async with app.run_test(size=SIZE) as pilot:
            if not await until(pilot, lambda: app.engine_ready, 60):
                raise RuntimeError(f"could not attach: {app.client.health()}")
            chat = app.screen.chat
            chat.query_one("#prompt", Input).focus()
            await pilot.press(*"What does the block map show?")
            await pilot.press("enter")
            await until(pilot, lambda: not chat.generating, 60)
            app._fire_load(BURST)
            state = app.dashboard_state
            await until(pilot, lambda: state.stats is not None and state.stats.num_running >= 6
                        and state.stats.kv_cache_usage > 0.3, 120)
            await pilot.pause(0.5)
            path = out / "attach-kvdeck-160x48.svg"
            app.save_screenshot(str(path))
            await app.load.stop()
        return path


async def shoot_vllm(out: Path) -> Path:
    replicas = [fake_vllm.VllmMetrics(), fake_vllm.VllmMetrics()]
    running = [fake_vllm.serve(fake_vllm.create_app(m)) for m in replicas]
    rng = random.Random(3)
    try:
        with tempfile.TemporaryDirectory() as chats:
            app = attached([r.url for r in running], chats)
            async with app.run_test(size=SIZE) as pilot:
                if not await until(pilot, lambda: app.engine_ready, 30):
                    raise RuntimeError("could not attach to the fake vLLM")
                for second in range(12):  # a deployment under load, one second at a time
                    for index, metrics in enumerate(replicas):
                        labels = dict(model_name=fake_vllm.MODEL, engine="0")
                        metrics.kv.labels(**labels).set(0.35 + 0.2 * index + 0.02 * second)
                        metrics.running.labels(**labels).set(12 + 4 * index)
                        metrics.waiting.labels(**labels).set(index * 3)
                        metrics.generation.labels(**labels).inc(900 + 120 * index)
                        metrics.prompt.labels(**labels).inc(4000)
                        metrics.queries.labels(**labels).inc(4000)
                        metrics.hits.labels(**labels).inc(2600 + 300 * index)
                        for _ in range(40):
                            metrics.ttft.labels(**labels).observe(rng.lognormvariate(-3 + index, 0.6))
                            metrics.itl.labels(**labels).observe(rng.lognormvariate(-4, 0.4))
                            metrics.e2e.labels(**labels).observe(rng.lognormvariate(0.5, 0.5))
                            metrics.queue.labels(**labels).observe(rng.lognormvariate(-5, 1.0))
                    await pilot.pause(1.0)
                chat = app.screen.chat
                chat.query_one("#prompt", Input).focus()
                await pilot.press(*"Summarise paged attention")
                await pilot.press("enter")
                await until(pilot, lambda: not chat.generating, 20)
                app.screen.dashboard.show_tab("tab-servers")
                await pilot.pause(1.0)
                path = out / "attach-vllm-160x48.svg"
                app.save_screenshot(str(path))
        return path
    finally:
        for server in running:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "assets" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as logs:
        server = start_server(REPO / "assets" / "demo_model", Path(logs), port=free_port())
        try:
            print(asyncio.run(shoot_kvdeck(server.base_url, args.out)))
        finally:
            stop_server(server)
    print(asyncio.run(shoot_vllm(args.out)))


if __name__ == "__main__":
    main()
