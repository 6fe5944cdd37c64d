"""Modal: the engine's speculative decoding and KV cache dtype (saving restarts the engine)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Button, Input, Label, Select, Static

from kvdeck.engine.types.config import KV_CACHE_DTYPES
from kvdeck.tui.engine_settings import SPECULATION_CHOICES, EngineSettings
from kvdeck.tui.screens.form_screen import FormScreen

KV_DTYPE_CHOICES = [(name if name != "auto" else "auto (the model's)", name)
                    for name in KV_CACHE_DTYPES]


class EngineSettingsScreen(FormScreen[EngineSettings]):

    DEFAULT_CSS = """
    EngineSettingsScreen { align: center middle; }
    EngineSettingsScreen > Vertical {
        width: 72; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    EngineSettingsScreen Grid {
        grid-size: 2; grid-columns: 1fr 1fr; grid-rows: 2 3 2 3; height: auto; grid-gutter: 0 1;
    }
    EngineSettingsScreen Grid Label { margin-top: 1; }
    EngineSettingsScreen #engine-settings-note { color: $text-muted; margin-top: 1; }
    EngineSettingsScreen #engine-settings-error { color: $error; height: auto; }
    EngineSettingsScreen Horizontal { height: auto; align-horizontal: right; }
    EngineSettingsScreen Button { margin-left: 1; }
    """

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical():
            with Grid():
                yield Label("Speculative decoding")
                yield Label("speculative tokens per step (k)")
                yield Select(SPECULATION_CHOICES, value=s.speculation, allow_blank=False,
                             id="speculation")
                yield Input(str(s.num_speculative_tokens), id="num-speculative-tokens")
                yield Label("draft model (folder or hub id)")
                yield Label("KV cache dtype")
                yield Input(s.draft_model, id="draft-model", placeholder="demo-draft")
                yield Select(KV_DTYPE_CHOICES, value=s.kv_cache_dtype, allow_blank=False,
                             id="kv-cache-dtype")
            yield Static("Saving restarts the engine: replies and bursts in flight end. "
                         "Acceptance shows in the dashboard's Speculation tab.",
                         id="engine-settings-note")
            yield Static("", id="engine-settings-error")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Save and restart", variant="primary", id="save")

    def on_mount(self) -> None:
        self._show_draft_field()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "speculation":
            self._show_draft_field()

    def _show_draft_field(self) -> None:
        speculation = self.query_one("#speculation", Select).value
        self.query_one("#draft-model", Input).disabled = speculation != "draft_model"

    def action_save(self) -> None:
        try:
            settings = EngineSettings.parse(
                str(self.query_one("#speculation", Select).value),
                self.query_one("#num-speculative-tokens", Input).value,
                self.query_one("#draft-model", Input).value,
                str(self.query_one("#kv-cache-dtype", Select).value),
            )
        except ValueError as exc:
            self.query_one("#engine-settings-error", Static).update(str(exc))
            return
        self.dismiss(settings)

    submit = action_save
