"""Modal: the system prompt, sampling settings, response format and (with LoRA on) the model
or LoRA adapter of the chat."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from kvdeck.tui.chat_settings import ChatSettings, auto_max_tokens
from kvdeck.tui.screens.form_screen import FormScreen

FORMAT_CHOICES = [("free text", "text"), ("any JSON object", "json"),
                  ("JSON schema (file)", "schema")]
THINKING_CHOICES = [("on: it reasons before the reply", True),
                    ("off: the template's enable_thinking false", False)]


class ChatSettingsScreen(FormScreen[ChatSettings]):

    DEFAULT_CSS = """
    ChatSettingsScreen { align: center middle; }
    ChatSettingsScreen > Vertical {
        width: 72; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    ChatSettingsScreen TextArea { height: 5; }
    ChatSettingsScreen Grid {
        grid-size: 4; grid-columns: 1fr; grid-rows: 1 3; height: auto; grid-gutter: 0 1;
        margin-top: 1;
    }
    ChatSettingsScreen #format-row { height: auto; margin-top: 1; align-horizontal: left; }
    ChatSettingsScreen #response-format { width: 26; }
    ChatSettingsScreen #schema-file { width: 1fr; }
    ChatSettingsScreen #settings-error { color: $error; height: auto; }
    ChatSettingsScreen Horizontal { height: auto; align-horizontal: right; }
    ChatSettingsScreen Button { margin-left: 1; }
    """

    def __init__(self, settings: ChatSettings, max_model_len: int | None = None,
                 adapters: list[tuple[str, str]] | None = None, model_name: str = "",
                 thinking_model: bool = False) -> None:
        """`adapters`: (label, folder) of the LoRA adapters to offer (None: LoRA is off, no
        model choice); `model_name`: the base model's, for its entry; `thinking_model`: its
        chat template knows <think>, so thinking can be switched off."""
        super().__init__()
        self.settings = settings
        self.max_model_len = max_model_len  # the loaded model's context, for the auto hint
        self.adapters = adapters
        self.model_name = model_name
        self.thinking_model = thinking_model

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical():
            yield Label("System prompt (applies from the next message)")
            yield TextArea(s.system_prompt, id="system-prompt")
            with Grid():
                yield Label("temperature")
                yield Label("top_p")
                yield Label("max_tokens")
                yield Label("seed")
                yield Input(f"{s.temperature:g}", id="temperature")
                yield Input(f"{s.top_p:g}", id="top-p")
                # A blank field takes its default, which the placeholder names (the labels
                # are a column wide: a hint after them would be cut).
                yield Input("" if s.max_tokens is None else str(s.max_tokens), id="max-tokens",
                            placeholder=self._auto_max_tokens())
                yield Input("" if s.seed is None else str(s.seed), id="seed", placeholder="random")
            yield Label("Response format (the reply is held to it by a grammar)")
            with Horizontal(id="format-row"):
                yield Select(FORMAT_CHOICES, value=s.response_format, allow_blank=False,
                             id="response-format")
                yield Input(s.schema_file or "", id="schema-file",
                            placeholder="a .json file, for JSON schema")
            if self.adapters is not None:
                yield Label("Model (a LoRA adapter runs over the loaded model)")
                choices = [(f"{self.model_name or 'the loaded model'} (base)", ""), *self.adapters]
                current = s.adapter if s.adapter in {path for _, path in self.adapters} else ""
                yield Select(choices, value=current, allow_blank=False, id="adapter")
            if self.thinking_model:
                yield Label("Thinking (a thinking model's reasoning, shown above its reply)")
                yield Select(THINKING_CHOICES, value=s.thinking, allow_blank=False, id="thinking")
            yield Static("", id="settings-error")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Save", variant="primary", id="save")

    def _auto_max_tokens(self) -> str:
        if self.max_model_len is None:
            return "auto"
        return f"auto: {auto_max_tokens(self.max_model_len)}"

    def _adapter(self) -> str:
        """The chosen adapter; the saved one where the engine offers no choice."""
        if self.adapters is None:
            return self.settings.adapter or ""
        return str(self.query_one("#adapter", Select).value)

    def _thinking(self) -> bool:
        """The choice; the saved one where the model has no thinking to switch."""
        if not self.thinking_model:
            return self.settings.thinking
        return bool(self.query_one("#thinking", Select).value)

    def _value(self, widget_id: str) -> str:
        return self.query_one(f"#{widget_id}", Input).value

    def action_save(self) -> None:
        try:
            settings = ChatSettings.parse(
                self.query_one("#system-prompt", TextArea).text,
                self._value("temperature"), self._value("top-p"),
                self._value("max-tokens"), self._value("seed"),
                str(self.query_one("#response-format", Select).value),
                self._value("schema-file"),
                self._adapter(),
                self._thinking(),
            )
            constraint = settings.structured_outputs()
            if constraint is not None:  # a schema llguidance cannot compile: said here
                from kvdeck.engine.grammar.compile import check_grammar

                what = (f"the schema in {settings.schema_file}"
                        if settings.response_format == "schema" else None)
                check_grammar(constraint, what)
        except ValueError as exc:
            self.query_one("#settings-error", Static).update(str(exc))
            return
        self.dismiss(settings)

    submit = action_save
