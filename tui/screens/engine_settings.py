"""Modal: the engine's speculative decoding and KV cache dtype (saving restarts the engine).

It offers the proposers that fit the loaded model (a bundled draft only beside the model
whose tokenizer it shares) and, under k, says where greedy output may part from plain
greedy decoding's on the engine that runs now."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Button, Input, Label, Select, Static

from kvdeck.engine.types.config import KV_CACHE_DTYPES
from kvdeck.engine.types.wire import EngineInfo
from kvdeck.tui.engine_settings import (
    CUSTOM_DRAFT_CHOICE,
    EngineSettings,
    exactness_hint,
    form_speculation,
    speculation_choices,
)
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
        grid-size: 2; grid-columns: 1fr 1fr; grid-rows: 2 auto 2 3; height: auto; grid-gutter: 0 1;
    }
    EngineSettingsScreen Grid Label { margin-top: 1; }
    EngineSettingsScreen #num-speculative-tokens-field { height: auto; }
    EngineSettingsScreen #spec-exactness-hint { color: $text-warning; height: auto; }
    EngineSettingsScreen #engine-settings-note { color: $text-muted; margin-top: 1; }
    EngineSettingsScreen #engine-settings-error { color: $error; height: auto; }
    EngineSettingsScreen Horizontal { height: auto; align-horizontal: right; }
    EngineSettingsScreen Button { margin-left: 1; }
    """

    def __init__(self, settings: EngineSettings, model: str | None = None,
                 info: EngineInfo | None = None) -> None:
        """`model`: what the engine was asked to run (None: the demo model), which decides the
        drafts offered; `info`: the running engine's (its device and dtype), if it is up."""
        super().__init__()
        self.settings = settings
        self.choices = speculation_choices(model)
        self.info = info

    def compose(self) -> ComposeResult:
        s = self.settings
        speculation = form_speculation(s, self.choices)
        # A bundled draft is a choice of its own; the field holds a draft of the user's.
        custom_draft = s.draft_model if speculation == CUSTOM_DRAFT_CHOICE[1] else ""
        with Vertical():
            with Grid():
                yield Label("Speculative decoding")
                yield Label("speculative tokens per step (k)")
                yield Select(self.choices, value=speculation, allow_blank=False, id="speculation")
                with Vertical(id="num-speculative-tokens-field"):
                    yield Input(str(s.num_speculative_tokens), id="num-speculative-tokens")
                    yield Static("", id="spec-exactness-hint")
                yield Label("draft model (folder or hub id)")
                yield Label("KV cache dtype")
                yield Input(custom_draft, id="draft-model", placeholder="same tokenizer as the model")
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
        self._show_exactness_hint()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "speculation":
            self._show_draft_field()
            self._show_exactness_hint()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "num-speculative-tokens":
            self._show_exactness_hint()

    def _show_draft_field(self) -> None:
        speculation = self.query_one("#speculation", Select).value
        self.query_one("#draft-model", Input).disabled = speculation != CUSTOM_DRAFT_CHOICE[1]

    def _show_exactness_hint(self) -> None:
        hint = exactness_hint(str(self.query_one("#speculation", Select).value),
                              self.query_one("#num-speculative-tokens", Input).value,
                              self.info.device if self.info else None,
                              self.info.dtype if self.info else None)
        widget = self.query_one("#spec-exactness-hint", Static)
        widget.update(hint)
        widget.display = bool(hint)

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
