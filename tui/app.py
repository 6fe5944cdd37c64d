"""The kvdeck Textual app: owns the engine client, the dashboard state and the sections.

`run_tui` is what `kvdeck` calls. The engine runs in a background process behind the client;
this process only draws, so the UI stays responsive whatever the engine does. `kvdeck
attach URL...` opens the same app on servers instead (`run_attached`): its client
talks HTTP, reconnects by itself, and a lost connection greys the dashboard instead of
showing the engine-error screen.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, cast

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from kvdeck.tui.activity import ActivityTracker
from kvdeck.tui.alerts import EngineAlerts
from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.engine_protocol import (
    ClientFactory,
    EngineClientProtocol,
    MetricsSource,
    StartupProgressLike,
)
from kvdeck.tui.engine_session import DEMO_MODEL_NAME, EngineSession, display_model_name
from kvdeck.tui.engine_settings import EngineSettings
from kvdeck.tui.key_lists import help_groups, section_and_key_commands
from kvdeck.tui.load_generator import LoadGenerator, LoadSpec, new_seed
from kvdeck.tui.messages import (
    EngineHealthCheck,
    LoadBurstStarted,
    RestartEngineRequested,
    SwitchModelRequested,
)
from kvdeck.tui.navigation import SECTIONS, section_bindings
from kvdeck.tui.recording_control import RecordingControl
from kvdeck.tui.screens.confirm_quit import ConfirmQuitScreen
from kvdeck.tui.screens.engine_error import EngineErrorScreen
from kvdeck.tui.screens.engine_settings import EngineSettingsScreen
from kvdeck.tui.screens.help import HelpScreen
from kvdeck.tui.screens.load_generator import LoadGeneratorScreen
from kvdeck.tui.screens.startup import StartupScreen
from kvdeck.tui.settings_store import SettingsStore
from kvdeck.tui.terminal_watch import hangup_safe, watch_terminal
from kvdeck.tui.transcripts import TranscriptStore, default_transcript_dir

if TYPE_CHECKING:
    from kvdeck.tui.attached_servers import AttachedServers

SHUTDOWN_TIMEOUT_S = 15.0
HEALTH_CHECK_S = 1.0


class KvdeckApp(App[int]):
    TITLE = "kvdeck"
    # Package data, found through importlib.resources so an installed wheel has it too.
    CSS_PATH = str(files("kvdeck.tui").joinpath("styles", "kvdeck.tcss"))
    DEFAULT_MODE = SECTIONS[0].id  # the modes themselves are added per app in __init__

    BINDINGS = [
        Binding("f1", "help", "Help", id="help", tooltip="Show the keys and the map legend"),
        Binding("ctrl+l", "load_generator", "Load test", id="load_generator",
                tooltip="Fire N concurrent synthetic requests (again: stop them)"),
        # priority: a focused Input takes ctrl+e as "end of line" (End does the same there).
        Binding("ctrl+e", "engine_settings", "Engine", id="engine_settings", priority=True,
                tooltip="Speculative decoding and the KV cache dtype (restarts the engine)"),
        Binding("f6", "next_server", "Next server", id="next_server",
                tooltip="Attached to several servers: chat with and map the next one"),
        # priority: the chat input (a TextArea) takes f7 as "select all" (ctrl+a does that too).
        Binding("f7", "toggle_recording", "Record", id="toggle_recording", priority=True, show=False,
                tooltip="Start/stop recording the session (kvdeck replay plays it)"),
        Binding("ctrl+t", "toggle_theme", "Light/dark", id="toggle_theme", show=False,
                tooltip="Switch between the light and dark theme"),
        # ctrl chords, not "q": a printable key with no input focused is typed into the
        # chat (or the screen's input), never taken as a command.
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True, show=False,
                tooltip="Quit and stop the engine (asks while something is running)"),
        Binding("ctrl+c", "quit", "Quit", id="quit_ctrl_c", priority=True, show=False,
                tooltip="Quit and stop the engine (asks while something is running)"),
        *section_bindings(SECTIONS),
    ]

    def __init__(
        self,
        client_factory: ClientFactory,
        model_name: str = DEMO_MODEL_NAME,
        *,
        model: str | None = None,
        transcript_dir: Path | None = None,
        chat_settings: ChatSettings | None = None,
        settings_store: SettingsStore | None = None,
        factory_for_model: Callable[[str | None, dict], ClientFactory] | None = None,
        engine_options: dict | None = None,
        servers: AttachedServers | None = None,
        record_to: Path | None = None,
        record_max_mb: float = 20.0,
    ) -> None:
        super().__init__()
        for section in SECTIONS:
            self.add_mode(section.id, partial(section.screen, self))
        self.client_factory = client_factory
        # How switch_model and the engine settings make a client: (model, engine options).
        self.factory_for_model = factory_for_model
        self.engine_options = dict(engine_options or {})  # the engine's flags (ctrl+e edits)
        self.servers = servers  # `kvdeck attach`: the servers watched (the chat's is selected)
        # The services handed to screens and widgets (they never reach into the App).
        self.engine = EngineSession(model=model, name=model_name)
        self.dashboard_state = DashboardState()
        self.settings = settings_store or SettingsStore(None, chat_settings)
        self.transcripts = TranscriptStore(transcript_dir or default_transcript_dir())
        self.activity = ActivityTracker()
        self.load_spec = LoadSpec()
        self.load: LoadGenerator | None = None
        self.recording = RecordingControl(self.dashboard_state, record_max_mb)  # f7, --record
        self.alerts = EngineAlerts()  # fallbacks, mid-run compiles, repeated preemptions
        self._record_to = record_to
        self._quitting = False
        self._engine_stopped = False
        self.exit_code = 0

    # What tests and the command palette read.
    @property
    def client(self) -> EngineClientProtocol | None:
        return self.engine.client

    @property
    def engine_ready(self) -> bool:
        return self.engine.ready

    @property
    def model_name(self) -> str:
        return self.engine.name

    @property
    def chat_settings(self) -> ChatSettings:
        return self.settings.current

    @property
    def transcript_store(self) -> TranscriptStore:
        return self.transcripts

    def get_driver_class(self):
        return hangup_safe(super().get_driver_class())  # quits when the terminal closes

    # ----- engine lifecycle -------------------------------------------------------------
    def on_mount(self) -> None:
        self.sub_title = self.engine.name
        watch_terminal(self, self._terminal_gone)
        if self.settings.problem:
            self.notify(self.settings.problem, severity="warning", timeout=8)
        if self.servers is not None:
            self.run_worker(self.servers.watch(), group="servers")
        if self._record_to is not None:
            self.action_toggle_recording(self._record_to)
        self.start_engine()
        self.set_interval(HEALTH_CHECK_S, self.check_engine_health)

    @work(group="engine", exclusive=True)
    async def start_engine(self) -> None:
        startup = StartupScreen(self.engine.name)
        await self.push_screen(startup)
        engine = self.engine
        old, engine.client, engine.ready = engine.client, None, False
        if old is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.shutdown(), SHUTDOWN_TIMEOUT_S)
            engine.mark_stopped(old)
        loop_thread = threading.get_ident()

        def on_progress(progress: StartupProgressLike) -> None:
            if threading.get_ident() == loop_thread:
                startup.advance(progress.stage, progress.message)
            else:
                self.call_from_thread(startup.advance, progress.stage, progress.message)

        try:
            # In a thread: the first call imports the engine (torch), which takes seconds
            # and must not freeze the start-up screen.
            client = engine.client = await asyncio.to_thread(self.client_factory)
            await client.start(on_progress=on_progress)
        except Exception as exc:
            self._close_startup(startup)
            title = ("Could not attach" if self.servers is not None
                     else "The engine failed to start")
            self.show_engine_error(title, f"{type(exc).__name__}: {exc}")
            return
        engine.mark_running(client)
        state = self.dashboard_state
        state.reset()
        state.max_model_len = client.max_model_len
        # An attached server: "kvdeck" (stats stream) or "openai" (metrics only).
        state.source = getattr(client, "kind", "engine")
        state.latency_feed = state.source == "kvdeck"
        state.connected = True
        if self.servers is not None:
            label = getattr(client, "engine_label", "server")
            state.source_label = f"{label} at {getattr(client, 'url', '')}"
            engine.name = client.model_name or engine.name
            self.title = f"kvdeck · attached to {state.source_label}"
        self.recording.engine_ready(client, engine.name)
        self.sub_title = self.recording.title(engine.name)
        self.load = LoadGenerator(client, state)
        add_output_listener = getattr(client, "add_output_listener", None)  # a local engine
        if add_output_listener is not None:  # finished requests' final figures
            add_output_listener(state.add_output)
        engine.ready = True
        self._close_startup(startup)
        self.alerts.reset()
        self._say_alerts(self.alerts.on_ready(engine.info))
        if state.source == "openai":
            self.consume_metrics(cast("MetricsSource", client))
        else:
            self.consume_stats(client)

    def _close_startup(self, startup: StartupScreen) -> None:
        """Remove the start-up screen, and anything opened over it meanwhile (help...)."""
        if startup not in self.screen_stack:
            return
        while self.screen is not startup:
            self.pop_screen()  # the stack changes at once; the removal finishes later
        startup.dismiss()

    @work(group="stats", exclusive=True)
    async def consume_stats(self, client: EngineClientProtocol) -> None:
        try:
            async for stats in client.stats_stream():
                if client is not self.engine.client:
                    return
                self.dashboard_state.add_stats(stats)
                self._say_alerts(self.alerts.observe(stats))
                drain = getattr(client, "drain_latencies", None)  # a kvdeck server's feed
                for kind, at, seconds in drain() if drain is not None else ():
                    self.dashboard_state.add_feed_latency(kind, at, seconds)
                for request in client.drain_ended() if hasattr(client, "drain_ended") else ():
                    self.dashboard_state.add_ended(request)
        except Exception as exc:
            if client is self.engine.client and not self._quitting:
                self.show_engine_error("The engine stopped", f"{type(exc).__name__}: {exc}")

    def _say_alerts(self, alerts: list[str]) -> None:
        for alert in alerts:
            self.notify(alert, severity="warning", timeout=10)

    @work(group="stats", exclusive=True)
    async def consume_metrics(self, client: MetricsSource) -> None:
        """A server seen through /metrics only (vLLM): its summaries feed the dashboard."""
        try:
            async for view in client.metrics_stream():
                if client is not self.engine.client:
                    return
                self.dashboard_state.add_metrics(view, time.time())
        except Exception as exc:
            if client is self.engine.client and not self._quitting:
                self.show_engine_error("The server refused", f"{type(exc).__name__}: {exc}")

    def check_engine_health(self) -> None:
        client = self.engine.client
        # The timer can still fire while the app closes, after its screens are gone.
        if client is None or self._quitting or not self.screen_stack:
            return
        if self.servers is not None:
            self._check_attached(client)
            return
        if not self.engine.ready:
            return
        health = client.health()
        if health.status in ("dead", "stopped"):
            self.show_engine_error(f"The engine is {health.status}", health.detail or "")

    def _check_attached(self, client: EngineClientProtocol) -> None:
        """An attached server that went away is not an error to acknowledge: its client
        reconnects by itself; meanwhile the chat waits and the dashboard greys."""
        if isinstance(self.screen, EngineErrorScreen) or self.load is None:
            return  # never attached (wrong URL or key), or a refused key: the screen says why
        health = client.health()
        connected = health.status == "ready"
        if connected != self.dashboard_state.connected:
            self.dashboard_state.connected = connected
            self.dashboard_state.version += 1
            if connected:
                self.notify(f"Reconnected: {health.detail}", timeout=3)
            else:
                self.notify(health.detail, severity="warning", timeout=5)
        self.engine.ready = connected and health.status != "stopped"

    def show_engine_error(self, title: str, detail: str) -> None:
        self.engine.ready = False
        if self._quitting or not self.screen_stack or isinstance(self.screen, EngineErrorScreen):
            return
        self.push_screen(EngineErrorScreen(title, detail))

    def switch_model(self, model: str | None, name: str | None = None) -> None:
        """Stop the engine and start it again on another model (None: the bundled demo)."""
        if self.servers is not None:
            raise ValueError("attached to a server: its model is chosen where it runs")
        if self.factory_for_model is None:
            raise ValueError("this app cannot switch models (no factory_for_model given)")
        self.client_factory = self.factory_for_model(model, self.engine_options)
        self.engine.model = model
        self.engine.name = name or display_model_name(model)
        self.engine.ready = False
        self.restart_engine()

    def restart_engine(self) -> None:
        if isinstance(self.screen, EngineErrorScreen):
            self.pop_screen()
        self.start_engine()

    def action_engine_settings(self) -> None:
        try:
            current = EngineSettings.from_engine_options(self.engine_options)
        except ValueError:  # flags the engine refused: start the form from the defaults
            current = EngineSettings()
        self.push_screen(EngineSettingsScreen(current, self.engine.model, self.engine.info),
                         self._apply_engine_settings)

    def _apply_engine_settings(self, settings: EngineSettings | None) -> None:
        if settings is None or self.factory_for_model is None:
            return
        self.engine_options = settings.apply(self.engine_options)
        self.client_factory = self.factory_for_model(self.engine.model, self.engine_options)
        self.engine.ready = False
        self.notify(f"Restarting the engine: {settings.describe()}")
        self.restart_engine()

    def action_next_server(self) -> None:
        """Chat with and map the next attached server (the table keeps watching them all)."""
        if self.servers is None or len(self.servers) < 2:
            return
        url = self.servers.select_next()
        self.client_factory = self.servers.client_factory()
        self.engine.name = url
        self.restart_engine()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_server":
            return self.servers is not None and len(self.servers) > 1
        if action == "engine_settings":  # attached: the server's engine is set where it runs
            return self.servers is None and self.factory_for_model is not None
        return True

    def on_restart_engine_requested(self, message: RestartEngineRequested) -> None:
        self.restart_engine()

    def on_engine_health_check(self, message: EngineHealthCheck) -> None:
        self.check_engine_health()

    def on_switch_model_requested(self, message: SwitchModelRequested) -> None:
        try:
            self.switch_model(message.model, message.name)
        except ValueError as exc:
            self.notify(str(exc), severity="error")

    async def stop_engine(self) -> None:
        """Stop the engine process (idempotent): end replies, bursts and jobs first."""
        if self._engine_stopped:
            return
        self._engine_stopped = True
        with contextlib.suppress(Exception):
            await self.activity.stop_all(timeout=5)
        self.engine.ready = False
        client = self.engine.client
        if client is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.shutdown(), SHUTDOWN_TIMEOUT_S)
        self.engine.mark_stopped(client)

    async def action_quit(self) -> None:
        """Quit; while a reply, a load burst or a job runs, ask first (asked twice: quit)."""
        if self._quitting:
            return
        running = self.activity.descriptions()
        if running and not isinstance(self.screen, ConfirmQuitScreen):
            self.push_screen(ConfirmQuitScreen(running), self._quit_answered)
            return
        await self._quit_now()

    def _quit_answered(self, answer: bool | None) -> None:
        if answer:
            self.run_worker(self._quit_now(), group="quit", exclusive=True)

    def _terminal_gone(self) -> None:
        """The terminal closed: quit without asking (nobody can answer), engine stopped."""
        if not self._quitting:
            self.run_worker(self._quit_now(), group="quit")

    async def _quit_now(self) -> None:
        if self._quitting:
            return
        self._quitting = True
        await self.stop_engine()
        self.exit(self.exit_code)

    async def on_unmount(self) -> None:
        self.recording.stop()
        await self.stop_engine()
        if self.servers is not None:
            await self.servers.close()

    # ----- actions ----------------------------------------------------------------------
    def action_switch_section(self, section_id: str) -> None:
        if section_id not in {s.id for s in SECTIONS}:
            raise ValueError(f"unknown section {section_id!r}")
        self.switch_mode(section_id)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        self.push_screen(HelpScreen(self.binding_groups()))

    def action_toggle_recording(self, path: Path | None = None) -> None:
        """Start recording (into `path`, or a new file under the data folder) or stop."""
        from kvdeck.app.record.format import RecordingError

        if self.recording.active:
            self.notify(f"Recording saved: {self.recording.stop()}", timeout=6)
        else:
            try:
                self.notify(f"Recording to {self.recording.start(path)}", timeout=4)
            except (RecordingError, OSError) as exc:
                self.notify(f"Cannot record: {exc}", severity="error", timeout=8)
        self.sub_title = self.recording.title(self.engine.name)

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_load_generator(self) -> None:
        client = self.engine.usable
        if client is None or self.load is None:
            self.notify("The engine is not ready yet.", severity="warning")
            return
        if self.load.running:
            self.action_stop_load()
            return
        self.push_screen(LoadGeneratorScreen(self.load_spec, client.max_model_len),
                         self._fire_load)

    def _fire_load(self, spec: LoadSpec | None) -> None:
        if spec is None:
            return
        self.load_spec = spec
        seed = spec.seed if spec.seed is not None else new_seed()  # fresh prompts each burst
        self.run_load(spec, seed)
        self.screen.post_message(LoadBurstStarted(spec.num_requests, seed))

    @work(group="load")
    async def run_load(self, spec: LoadSpec, seed: int | None = None) -> None:
        load = self.load
        assert load is not None
        seed = seed if seed is not None else spec.seed if spec.seed is not None else new_seed()
        shared = (f", the first {spec.shared_prefix_tokens} shared (one leader first)"
                  if spec.shared_prefix_tokens else "")
        self.notify(f"Load: {spec.num_requests} requests × {spec.prompt_tokens} prompt tokens"
                    f"{shared} + {spec.output_tokens} output · seed {seed}", timeout=4)
        self.activity.begin("load", f"a load burst of {spec.num_requests} requests", load.stop)
        try:
            result = await load.run(spec, seed)
        except Exception as exc:
            self.notify(f"Load generator failed: {exc}", severity="error")
            return
        finally:
            self.activity.end("load")
        summary = (f"Load done (seed {result.seed}): {result.completed} finished, "
                   f"{result.aborted} stopped, {result.failed} failed, "
                   f"{result.output_tokens} tokens out")
        self.notify(summary, severity="error" if result.failed else "information", timeout=5)

    def action_stop_load(self) -> None:
        if self.load is not None and self.load.running:
            self.run_worker(self.load.stop(), group="load-stop")
            self.notify("Stopping the load burst.", timeout=2)

    # ----- help and command palette (key_lists.py) ----------------------------------------
    def binding_groups(self) -> list[tuple[str, list[Binding]]]:
        return help_groups(self)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from section_and_key_commands(self, screen)
