"""Modal: before quantising a model, choose AWQ or RTN and the group size, see how long each
would take on this machine and what it costs in quality, and confirm a long job.

The estimate comes from a timed probe (kvdeck.app.jobs.quantize_estimate) that the Models
screen hands in as `start_probe`: it runs in its own process while the dialog is open, reports
RTN's time first and AWQ's once one layer is done, and is stopped when the dialog closes.
Enter starts the chosen job; one estimated over CONFIRM_ABOVE_S (or not measured yet) asks
first, and a second Enter starts it. Escape cancels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, RadioButton, RadioSet, Static

from kvdeck.app.jobs.quantize import QuantizeOptions
from kvdeck.app.jobs.quantize_estimate import (
    CONFIRM_ABOVE_S,
    METHOD_NAMES,
    METHOD_SUMMARIES,
    QuantizeEstimate,
    format_estimate,
    quality_note,
)
from kvdeck.app.store.local_models import LocalModel

OnEstimate = Callable[[QuantizeEstimate], None]
OnStep = Callable[[str], None]
OnEnd = Callable[[str | None], None]  # the probe's error, or None


class Probe(Protocol):
    def cancel_in_background(self) -> None: ...


class ProbeFactory(Protocol):
    """quantize_estimate.start_probe, which the Models screen is given (a fake in tests)."""

    def __call__(self, model: LocalModel, options: QuantizeOptions | None, on_estimate: OnEstimate,
                 on_step: OnStep, on_end: OnEnd, group_size: int | None = None) -> Probe: ...


# (on_estimate, on_step, on_end) -> the running probe; the callbacks may come from any thread.
StartProbe = Callable[[OnEstimate, OnStep, OnEnd], Probe]


@dataclass(frozen=True, slots=True)
class QuantizeChoice:
    method: str  # awq | rtn
    group_size: int


class QuantizeDialog(ModalScreen[QuantizeChoice | None]):
    BINDINGS = [
        Binding("enter", "start", "Start", id="quantize_start", priority=True),
        Binding("escape", "cancel", "Cancel", id="quantize_cancel"),
        Binding("a", "choose('awq')", "AWQ", id="quantize_choose_awq"),
        Binding("r", "choose('rtn')", "RTN", id="quantize_choose_rtn"),
    ]
    DEFAULT_CSS = """
    QuantizeDialog { align: center middle; }
    QuantizeDialog > Vertical {
        width: 92; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    QuantizeDialog .title { text-style: bold; }
    QuantizeDialog .field { margin-top: 1; }
    QuantizeDialog RadioSet { width: 100%; }
    QuantizeDialog #group-size { layout: horizontal; width: auto; }
    QuantizeDialog #group-note, QuantizeDialog #quality-note, QuantizeDialog #estimate-detail {
        color: $text-muted; height: auto;
    }
    QuantizeDialog #confirm-text { color: $warning; height: auto; margin-top: 1; }
    QuantizeDialog Horizontal { height: auto; align-horizontal: right; margin-top: 1; }
    QuantizeDialog Button { margin-left: 1; }
    """

    def __init__(self, model_name: str, group_sizes: list[int], start_probe: StartProbe | None = None,
                 estimate: QuantizeEstimate | None = None, group_note: str = "") -> None:
        super().__init__()
        if not group_sizes:
            raise ValueError("no group size to offer")
        self.model_name = model_name
        self.group_sizes = group_sizes
        self.start_probe = start_probe
        self.estimate = estimate
        self.group_note = group_note  # why the sizes not offered do not fit
        self.probe: Probe | None = None
        self.probe_step = "measuring on this machine…" if start_probe and estimate is None else ""
        self.probe_error: str | None = None
        self.confirming = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Quantise {self.model_name} to INT4", classes="title")
            yield Label("Method (a / r)", classes="field")
            with RadioSet(id="method"):
                yield RadioButton(self._method_label("awq"), value=True, id="method-awq")
                yield RadioButton(self._method_label("rtn"), id="method-rtn")
            yield Label("Group size (weights that share a scale; smaller: a little better, larger files)",
                        classes="field")
            with RadioSet(id="group-size"):
                for index, size in enumerate(self.group_sizes):
                    yield RadioButton(str(size), value=index == 0, id=f"group-{size}")
            yield Static(self.group_note, id="group-note")
            yield Static(quality_note(), id="quality-note", classes="field")
            yield Static("", id="estimate-detail")
            yield Static("", id="confirm-text")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Start", variant="primary", id="start")

    def on_mount(self) -> None:
        self.query_one("#group-note", Static).display = bool(self.group_note)
        self.query_one("#method", RadioSet).focus()
        if self.start_probe is not None and self.estimate is None:
            try:
                self.probe = self.start_probe(self._from_thread(self.show_estimate),
                                              self._from_thread(self.show_probe_step),
                                              self._from_thread(self.probe_ended))
            except Exception as exc:  # noqa: BLE001 - no estimate, but the choice stays open
                self.probe_error = f"{type(exc).__name__}: {exc}"
                self.probe_step = ""
        self._refresh()

    def on_unmount(self) -> None:
        if self.probe is not None:
            self.probe.cancel_in_background()  # the job it measured for may start now
            self.probe = None

    # -- what is chosen --------------------------------------------------------------------

    @property
    def method(self) -> str:
        return "rtn" if self.query_one("#method-rtn", RadioButton).value else "awq"

    @property
    def group_size(self) -> int:
        for size in self.group_sizes:
            if self.query_one(f"#group-{size}", RadioButton).value:
                return size
        return self.group_sizes[0]

    def action_choose(self, method: str) -> None:
        self.query_one(f"#method-{method}", RadioButton).value = True

    @on(RadioSet.Changed)
    def _changed(self) -> None:
        self.confirming = False
        self._refresh()

    # -- the probe's reports (on the UI thread) --------------------------------------------

    def show_estimate(self, estimate: QuantizeEstimate) -> None:
        self.estimate = estimate
        if estimate.awq is not None:
            self.probe_step = ""
        self._refresh()

    def show_probe_step(self, what: str) -> None:
        if self.estimate is None or self.estimate.awq is None:
            self.probe_step = f"timing one layer of AWQ here: {what}"
            self._refresh()

    def probe_ended(self, error: str | None) -> None:
        self.probe = None
        if error is not None:
            self.probe_error = error
            self.probe_step = ""
            self._refresh()

    def _from_thread(self, callback: Callable) -> Callable:
        app = self.app  # taken here, on the UI thread

        def call(*args: object) -> None:
            # A closed app's loop would refuse the call after its coroutine was made, leaving
            # it never awaited (a RuntimeWarning at exit): ask first, and still catch the race.
            if not app.is_running:
                return
            try:
                app.call_from_thread(self._if_open, callback, *args)
            except RuntimeError:  # the app closed just now
                pass

        return call

    def _if_open(self, callback: Callable, *args: object) -> None:
        if self.is_attached:
            callback(*args)

    # -- start, cancel ---------------------------------------------------------------------

    def action_start(self) -> None:
        if self.focused is not None and self.focused.id == "cancel":
            self.action_cancel()  # Enter on the Cancel button
            return
        if not self.confirming and self._needs_confirmation():
            self.confirming = True
            self._refresh()
            return
        self.dismiss(QuantizeChoice(self.method, self.group_size))

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        else:
            self.action_cancel()

    def _needs_confirmation(self) -> bool:
        estimate = self.estimate.get(self.method) if self.estimate is not None else None
        return estimate is None or estimate.needs_confirmation

    # -- drawing ---------------------------------------------------------------------------

    def _method_label(self, method: str) -> str:
        return f"{METHOD_NAMES[method]} · {self._time_text(method)} · {METHOD_SUMMARIES[method]}"

    def _time_text(self, method: str) -> str:
        estimate = self.estimate.get(method) if self.estimate is not None else None
        if estimate is not None:
            return f"{format_estimate(estimate.seconds)} here"
        if self.probe_error is not None:
            return "time unknown (the probe failed)"
        return "measuring…" if self.start_probe is not None else "time unknown"

    def _refresh(self) -> None:
        for method in METHOD_NAMES:
            self.query_one(f"#method-{method}", RadioButton).label = self._method_label(method)
        chosen = self.estimate.get(self.method) if self.estimate is not None else None
        if chosen is not None:
            detail = f"Estimate: {chosen.how}."
        elif self.probe_error is not None:
            detail = f"The timing probe failed: {self.probe_error}"
        else:
            detail = self.probe_step[:1].upper() + self.probe_step[1:]
        self.query_one("#estimate-detail", Static).update(detail)
        confirm, start = "", "Start"
        if self.confirming:
            name = METHOD_NAMES[self.method]
            if chosen is None:
                confirm = (f"{name}'s time on this machine is not known yet. Enter starts it anyway; "
                           "Escape cancels.")
            else:
                confirm = (f"{name} will take {format_estimate(chosen.seconds)} on this machine (more "
                           f"than {CONFIRM_ABOVE_S / 60:g} min). Enter starts it; Escape cancels.")
            start = "Start anyway"
        self.query_one("#confirm-text", Static).update(confirm)
        self.query_one("#confirm-text", Static).display = bool(confirm)
        self.query_one("#start", Button).label = start
