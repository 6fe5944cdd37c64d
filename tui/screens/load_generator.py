"""Modal: how many synthetic requests to fire, and how long their prompts and outputs are."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from kvdeck.tui.load_generator import LoadSpec
from kvdeck.tui.screens.form_screen import FormScreen

FIELDS = (
    ("num_requests", "requests (concurrent)"),
    ("prompt_tokens", "prompt tokens"),
    ("output_tokens", "output tokens"),
    ("shared_prefix_tokens", "shared prefix tokens"),
    ("seed", "seed (blank: new prompts each burst)"),
)
OPTIONAL = {"seed"}  # blank means None


class LoadGeneratorScreen(FormScreen[LoadSpec]):
    SUBMIT_BUTTON = "fire"

    DEFAULT_CSS = """
    LoadGeneratorScreen { align: center middle; }
    LoadGeneratorScreen > Vertical {
        width: 64; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    LoadGeneratorScreen Grid {
        grid-size: 2; grid-columns: 1fr 16; height: auto; grid-rows: 3;
    }
    LoadGeneratorScreen Grid Label { padding-top: 1; }
    LoadGeneratorScreen #load-error { color: $error; height: auto; }
    LoadGeneratorScreen Horizontal { height: auto; align-horizontal: right; }
    LoadGeneratorScreen Button { margin-left: 1; }
    """

    def __init__(self, spec: LoadSpec, max_model_len: int | None) -> None:
        super().__init__()
        self.spec = spec
        self.max_model_len = max_model_len

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Load generator: concurrent requests with random-token prompts "
                         "(ignore_eos). With a shared prefix, one leader goes first and the rest "
                         "share its cached blocks.", id="load-intro")  # a Label would not wrap
            with Grid():
                for name, label in FIELDS:
                    value = getattr(self.spec, name)
                    yield Label(label)
                    yield Input("" if value is None else str(value), id=name, type="integer")
            yield Static("", id="load-error")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Fire", variant="primary", id="fire")

    def action_fire(self) -> None:
        values: dict[str, int | None] = {}
        try:
            for name, _ in FIELDS:
                text = self.query_one(f"#{name}", Input).value.strip()
                if not text and name in OPTIONAL:
                    values[name] = None
                    continue
                try:
                    values[name] = int(text)
                except ValueError:
                    raise ValueError(f"{name} must be an integer, got {text!r}") from None
            spec = LoadSpec()
            for name, value in values.items():
                setattr(spec, name, value)
            spec.validate(self.max_model_len)
        except ValueError as exc:
            self.query_one("#load-error", Static).update(str(exc))
            return
        self.dismiss(spec)

    submit = action_fire
