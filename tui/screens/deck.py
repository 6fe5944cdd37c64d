"""The main screen: chat beside the dashboard; one of them at a time in narrow terminals."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Header

from kvdeck.tui.activity import ActivityTracker
from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.engine_session import EngineSession
from kvdeck.tui.key_routing import is_shown, stray_paste, stray_text
from kvdeck.tui.lora_choices import adapter_choices
from kvdeck.tui.messages import ChatFocusRequested, LoadBurstStarted
from kvdeck.tui.screens.chat_settings import ChatSettingsScreen
from kvdeck.tui.screens.transcript_picker import TranscriptPickerScreen
from kvdeck.tui.settings_store import SettingsStore
from kvdeck.tui.transcripts import TranscriptStore
from kvdeck.tui.widgets.chat_input import ChatInput
from kvdeck.tui.widgets.chat_message import ChatMessage
from kvdeck.tui.widgets.chat_pane import ChatPane
from kvdeck.tui.widgets.dashboard import Dashboard
from kvdeck.tui.widgets.mini_stats import MiniStats
from kvdeck.tui.widgets.request_table import RequestTable

if TYPE_CHECKING:
    from kvdeck.tui.attached_servers import AttachedServers

NARROW_BELOW = 120  # columns; below this chat and dashboard take turns (f2)


class DeckScreen(Screen[None]):
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]

    BINDINGS = [
        Binding("escape", "stop_reply", "Stop", id="stop_reply",
                tooltip="Stop the streaming reply and keep what arrived"),
        Binding("f2", "toggle_pane", "Chat⇄Dash", id="toggle_pane",
                tooltip="Switch between chat and dashboard (wide: dashboard full width)"),
        Binding("f3", "toggle_tab", "Next tab", id="toggle_dashboard_tab", show=False,
                tooltip="Next dashboard tab: block map, latency graphs, speculation "
                        "(attached: servers)"),
        Binding("ctrl+s", "chat_settings", "Settings", id="chat_settings",
                tooltip="System prompt and sampling settings (temperature, top_p, ...)"),
        Binding("ctrl+n", "new_chat", "New", id="new_chat",
                tooltip="Start a new chat (the current one stays saved)"),
        Binding("ctrl+o", "open_chat", "Open chat", id="open_chat", show=False,
                tooltip="Reopen a saved chat transcript"),
        Binding("ctrl+y", "copy_reply", "Copy reply", id="copy_reply", show=False,
                tooltip="Copy the last reply to the clipboard"),
    ]

    HELP_GROUPS = [
        ("The chat input (Enter sends)", ChatInput.BINDINGS),
        ("A focused chat message", ChatMessage.BINDINGS),
        ("The request table (Tab to it; ↑↓ move)", RequestTable.BINDINGS),
    ]

    def __init__(self, engine: EngineSession, state: DashboardState, settings: SettingsStore,
                 transcripts: TranscriptStore, activity: ActivityTracker,
                 servers: AttachedServers | None = None) -> None:
        super().__init__()
        self.servers = servers  # attached (`kvdeck attach`): the servers' table
        self.engine = engine
        self.state = state
        self.settings = settings
        self.transcripts = transcripts
        self.activity = activity
        self._was_narrow: bool | None = None

    def compose(self) -> ComposeResult:
        yield Header(icon="▦")
        yield MiniStats(self.state, id="mini-stats")
        with Horizontal(id="deck-body"):
            yield ChatPane(self.engine, self.state, self.settings, self.transcripts,
                           self.activity, id="chat")
            yield Dashboard(self.state, self.servers, id="dashboard")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(ChatPane).focus_input()

    @property
    def chat(self) -> ChatPane:
        return self.query_one(ChatPane)

    @property
    def dashboard(self) -> Dashboard:
        return self.query_one(Dashboard)

    def on_key(self, event: events.Key) -> None:
        """Text typed while the focus is elsewhere (the map, a table, nothing) is the
        user's message: it goes to the chat input, bringing the chat into view."""
        text = stray_text(self, event)
        if text is None:
            return
        event.stop()
        event.prevent_default()
        if not is_shown(self.chat.prompt_input):
            self.show_pane("chat")
        self.chat.type_into_input(text)

    def on_paste(self, event: events.Paste) -> None:
        """A paste with the focus on the map or a table is a message too, all its lines."""
        text = stray_paste(self, event)
        if text is None:
            return
        event.stop()
        if not is_shown(self.chat.prompt_input):
            self.show_pane("chat")
        self.chat.type_into_input(text)

    def on_resize(self, event: events.Resize) -> None:
        narrow = event.size.width < NARROW_BELOW
        if self._was_narrow and not narrow:
            self.set_class(False, "-show-dashboard")  # wide again: both panes in view
        self._was_narrow = narrow
        self.call_after_refresh(self._keep_focus_in_view)

    def _keep_focus_in_view(self) -> None:
        """A layout change may hide the focused widget: keys would go nowhere."""
        focused = self.focused
        if focused is not None and is_shown(focused):
            return
        if is_shown(self.chat.prompt_input):
            self.chat.focus_input()
        elif is_shown(self.dashboard):
            self.dashboard.focus()

    def show_pane(self, pane: str) -> None:
        """In a narrow terminal show "chat" or "dashboard"; in a wide one, "dashboard" hides
        the chat (a full-width map) and "chat" shows both again."""
        if pane not in ("chat", "dashboard"):
            raise ValueError(f"pane must be 'chat' or 'dashboard', got {pane!r}")
        self.set_class(pane == "dashboard", "-show-dashboard")
        if pane == "chat":
            self.chat.focus_input()
        else:
            self.dashboard.focus()

    def action_toggle_pane(self) -> None:
        if self.has_class("-show-dashboard"):
            self.show_pane("chat")
        elif self.chat.prompt_input.text.strip():
            self.notify("Your message is still in the input: send it (Enter) or clear it "
                        "first.", severity="warning", timeout=4)
        else:
            self.show_pane("dashboard")

    def action_toggle_tab(self) -> None:
        dashboard = self.dashboard
        tabs = ["tab-blocks", "tab-latency", "tab-spec",
                *(["tab-servers"] if self.servers else [])]
        current = tabs.index(dashboard.active_tab) if dashboard.active_tab in tabs else -1
        dashboard.show_tab(tabs[(current + 1) % len(tabs)])
        if self.has_class("-narrow") and not self.has_class("-show-dashboard"):
            self.show_pane("dashboard")

    def on_chat_focus_requested(self, message: ChatFocusRequested) -> None:
        message.stop()
        self.show_pane("chat")

    def on_load_burst_started(self, message: LoadBurstStarted) -> None:
        if self.has_class("-narrow") and not self.chat.prompt_input.text.strip():
            self.show_pane("dashboard")

    async def action_stop_reply(self) -> None:
        await self.chat.stop()

    async def action_new_chat(self) -> None:
        await self.chat.new_chat()
        self.show_pane("chat")

    def action_chat_settings(self) -> None:
        def apply(settings: ChatSettings | None) -> None:
            if settings is None:
                return
            try:
                self.settings.save(settings)
            except OSError as exc:
                self.notify(f"Settings apply to this session only; saving failed: {exc}",
                            severity="warning")
            else:
                self.notify("Chat settings saved.", timeout=2)
            self.chat.update_status()

        client = self.engine.usable
        context = client.max_model_len if client is not None else None
        thinking = client is not None and self.chat.reasoning_format(client) is not None
        self.app.push_screen(ChatSettingsScreen(self.settings.current, context,
                                                adapter_choices(client), self.engine.name,
                                                thinking_model=thinking), apply)

    def action_open_chat(self) -> None:
        self.app.push_screen(TranscriptPickerScreen(self.transcripts.list()), self._open_transcript)

    def _open_transcript(self, transcript_id: str | None) -> None:
        if transcript_id is not None:
            self.run_worker(self._reopen(transcript_id), group="reopen", exclusive=True)

    async def _reopen(self, transcript_id: str) -> None:
        transcript = self.transcripts.load(transcript_id)
        await self.chat.stop()
        await self.chat.workers_done()
        # The reopened chat goes on with its own system prompt (for this session).
        self.settings.current = replace(self.settings.current,
                                        system_prompt=transcript.system_prompt)
        await self.chat.show_transcript(transcript)
        self.show_pane("chat")

    def action_copy_reply(self) -> None:
        self.chat.copy_last_reply()
