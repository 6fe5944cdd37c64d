"""LoRA in the TUI, driven with the Pilot against the fake engine: the request inspector names
a request's adapter, the chat settings offer the adapters beside the models when the engine
runs with LoRA on (and no model choice when it does not), the chat's replies then run under
the chosen adapter, and the dashboard names the adapters in use and the slots they sit in."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

from textual.app import App, ComposeResult
from textual.widgets import Select, Static

from kvdeck.app.store import paths
from kvdeck.engine.types.stats import LoRASlotStats
from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.screens.chat_settings import ChatSettingsScreen
from kvdeck.tui.widgets.engine_summary import EngineSummary, lora_line
from kvdeck.tui.widgets.lora_slots import LoRASlots
from kvdeck.tui.widgets.request_inspector import RequestInspector
from tests.tui.conftest import wait_for
from tests.tui.demo_stats import demo_stats
from tests.tui.fake_engine import FakeEngineClient
from tests.tui.test_chat_pilot import send


class LoRAFakeClient(FakeEngineClient):
    """The fake engine as if started with enable_lora: it records each request's adapter."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.config = SimpleNamespace(enable_lora=True)
        self.lora_requests: list = []

    async def generate(self, prompt, params, request_id=None, messages=None, lora_request=None):
        self.lora_requests.append(lora_request)
        async for out in super().generate(prompt, params, request_id, messages):
            yield out


def _adapter(name: str, rank: int = 8):
    folder = paths.store_dir() / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    (folder / "adapter_model.safetensors").write_bytes(b"read by the engine")
    return folder


class InspectorApp(App):
    def compose(self) -> ComposeResult:
        yield RequestInspector()


async def test_the_inspector_names_a_requests_adapter():
    stats = demo_stats()
    stats.requests = [replace(stats.requests[0], lora_name="sql"), *stats.requests[1:]]
    app = InspectorApp()
    async with app.run_test(size=(120, 30)) as pilot:
        inspector = app.query_one(RequestInspector)
        inspector.show(stats)
        inspector.select("chat-1a2b")
        await pilot.pause()
        detail = str(app.query_one("#request-detail", Static).render())
        assert "LoRA adapter sql" in detail
        label = inspector.table.get_row("chat-1a2b")[0]
        assert str(label) == "chat-1a2b [sql]"
        other = str(inspector.table.get_row("load1-0")[0])
        assert other == "load1-0"  # the base model's requests name none


async def test_the_chat_picks_an_adapter_and_replies_run_under_it(tmp_path):
    sql = _adapter("sql", rank=16)
    _adapter("broken", rank=0)  # not offered: the engine would refuse it
    clients: list[LoRAFakeClient] = []

    def factory() -> LoRAFakeClient:
        clients.append(LoRAFakeClient(reply="Yes."))
        return clients[-1]

    app = KvdeckApp(factory, model_name="fake-llama", transcript_dir=tmp_path / "chats")
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        app.screen.action_chat_settings()
        assert await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        await pilot.pause()
        assert app.screen.adapters is not None
        choice = app.screen.query_one("#adapter", Select)
        options = [(str(label), value) for label, value in choice._options]
        assert options == [("fake-llama (base)", ""), ("sql (LoRA, rank 16)", str(sql))]
        choice.value = str(sql)
        app.screen.action_save()
        assert await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsScreen))
        assert await wait_for(pilot, lambda: app.screen.settings.current.adapter == str(sql))
        await send(pilot, "hello")
        assert await wait_for(pilot, lambda: clients[-1].lora_requests, timeout=5)
        lora = clients[-1].lora_requests[-1]
        assert (lora.lora_name, lora.lora_path) == ("sql", str(sql.resolve()))
        chat = app.screen.chat
        assert await wait_for(pilot, lambda: not chat.generating, timeout=10)
        assert chat.transcript.turns[-1].stats.endswith(" · LoRA sql")  # the reply says so


async def test_no_model_choice_without_lora(make_app):
    _adapter("sql")
    app, _ = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        app.screen.action_chat_settings()
        assert await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        await pilot.pause()
        assert app.screen.adapters is None and not app.screen.query("#adapter")


def test_the_dashboard_line_names_the_adapters_in_use():
    stats = demo_stats()
    requests = stats.requests
    stats.requests = [replace(requests[0], lora_name="sql"), replace(requests[1], lora_name="sql"),
                      replace(requests[2], lora_name="code"), replace(requests[4], lora_name="sql"),
                      *requests[5:]]
    line = lora_line(DashboardState(stats=stats)).plain
    assert line == "LoRA running code×1, sql×2  waiting sql×1  · 2 in the batch"
    stats.requests = requests  # the base model's only: no line
    assert lora_line(DashboardState(stats=stats)).plain == ""


class SummaryApp(App):
    def compose(self) -> ComposeResult:
        yield EngineSummary()


async def test_the_dashboard_shows_each_slots_adapter():
    stats = demo_stats()
    stats.lora = LoRASlotStats(["sql", None, "code", None], [8, 0, 4, 0], host_adapters=3, max_cpu_loras=8)
    app = SummaryApp()
    async with app.run_test(size=(120, 20)) as pilot:
        summary = app.query_one(EngineSummary)
        summary.show(DashboardState(stats=stats))
        await pilot.pause()
        slots = app.query_one(LoRASlots)
        assert slots.display
        assert str(slots.render()) == "slots [0 sql r8] [1 ·] [2 code r4] [3 ·] · 2/4 in use · host 3/8"
        assert slots.region.height == 1
        stats.lora = None  # LoRA off: no slots line
        summary.show(DashboardState(stats=stats))
        await pilot.pause()
        assert not slots.display
