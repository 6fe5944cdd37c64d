"""Pilot tests of the quantise dialog: both methods with their time here and quality, Enter
starts a short job, a long (or not yet measured) one asks first, Escape cancels, the probe
stops when the dialog closes."""

from __future__ import annotations

import threading

import pytest
from textual.app import App

from kvdeck.app.jobs.quantize_estimate import MethodEstimate, QuantizeEstimate
from kvdeck.tui.screens.quantize_dialog import QuantizeChoice, QuantizeDialog
from tests.tui.conftest import wait_for

SHORT = QuantizeEstimate(MethodEstimate("rtn", 8.0, "one layer rounded in 40 ms here"),
                         MethodEstimate("awq", 95.0, "the first layer's AWQ on 128 calibration "
                                                     "sequences took 3.0 s here"))
LONG = QuantizeEstimate(SHORT.rtn, MethodEstimate("awq", 330.0, "one layer's AWQ took 11 s here"))


class FakeProbe:
    """Reports the given estimates from a thread of its own (as the probe's monitor does):
    RTN's first, then both; remembers whether it was cancelled."""

    def __init__(self, estimates: list[QuantizeEstimate], steps: list[str] = (), error: str | None = None,
                 hold: bool = False, first: list[QuantizeEstimate] = ()) -> None:
        self.estimates, self.steps, self.error, self.first = estimates, list(steps), error, list(first)
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.cancelled = threading.Event()

    def __call__(self, on_estimate, on_step, on_end):
        def run() -> None:
            for estimate in self.first:  # before `release`: RTN's, say
                on_estimate(estimate)
            for what in self.steps:
                on_step(what)
            self.release.wait(10)
            for estimate in self.estimates:
                on_estimate(estimate)
            on_end(self.error)

        threading.Thread(target=run, daemon=True).start()
        return self

    def cancel_in_background(self) -> None:
        self.cancelled.set()


class DialogApp(App):
    def __init__(self, dialog: QuantizeDialog) -> None:
        super().__init__()
        self.dialog = dialog
        self.results: list[QuantizeChoice | None] = []

    def on_mount(self) -> None:
        self.push_screen(self.dialog, self.results.append)


def _text(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


def _label(app, method: str) -> str:
    return str(app.screen.query_one(f"#method-{method}").label)


async def test_shows_both_methods_with_their_estimate_and_quality():
    probe = FakeProbe([SHORT], first=[QuantizeEstimate(SHORT.rtn, None)],
                      steps=["scale search, q/k/v (3/20)"], hold=True)
    app = DialogApp(QuantizeDialog("tiny-llama", [64, 32], probe, group_note="Not offered: 128: no"))
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_for(pilot, lambda: "Timing one layer of AWQ here: scale search"
                              in _text(app, "#estimate-detail"))
        assert "about 8 s here" in _label(app, "rtn")  # RTN's time comes first
        assert _label(app, "awq") == "AWQ · measuring… · better quality (scales fitted on calibration text)"
        assert _label(app, "rtn") == "RTN · about 8 s here · lower quality (round to nearest, no calibration)"
        assert "+15% with AWQ, +37% with RTN" in _text(app, "#quality-note")
        assert "Not offered: 128" in _text(app, "#group-note")
        probe.release.set()
        assert await wait_for(pilot, lambda: "about 2 min here" in _label(app, "awq"))
        assert "about 8 s here" in _label(app, "rtn")
        assert "128 calibration sequences" in _text(app, "#estimate-detail")
        assert app.screen.group_size == 64  # the largest that fits, first


async def test_enter_starts_a_short_job_at_once():
    probe = FakeProbe([SHORT], first=[QuantizeEstimate(SHORT.rtn, None)], hold=True)  # AWQ: measuring
    app = DialogApp(QuantizeDialog("tiny-llama", [128, 64, 32], probe))
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_for(pilot, lambda: "about 8 s here" in _label(app, "rtn"))
        await pilot.press("r")
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.results != [])
        assert app.results == [QuantizeChoice("rtn", 128)]
        assert probe.cancelled.is_set()  # the probe, still timing AWQ, stops as the job starts


async def test_a_long_job_asks_first_then_starts_with_the_group_size_chosen():
    probe = FakeProbe([LONG])
    app = DialogApp(QuantizeDialog("SmolLM2", [64, 32], probe))
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_for(pilot, lambda: "about 6 min here" in _label(app, "awq"))
        app.screen.query_one("#group-32").value = True
        await pilot.press("enter")
        await pilot.pause()
        assert app.results == [] and isinstance(app.screen, QuantizeDialog)
        confirm = _text(app, "#confirm-text")
        assert "AWQ will take about 6 min on this machine (more than 2 min)" in confirm
        assert str(app.screen.query_one("#start").label) == "Start anyway"
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.results != [])
        assert app.results == [QuantizeChoice("awq", 32)]


async def test_changing_the_method_drops_the_question():
    app = DialogApp(QuantizeDialog("SmolLM2", [64], FakeProbe([LONG])))
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_for(pilot, lambda: "about 6 min here" in _label(app, "awq"))
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.confirming
        await pilot.press("r")  # RTN: seconds, no question
        await pilot.pause()
        assert not app.screen.confirming and not app.screen.query_one("#confirm-text").display
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.results == [QuantizeChoice("rtn", 64)])


async def test_escape_cancels_and_stops_the_probe():
    probe = FakeProbe([SHORT], hold=True)
    app = DialogApp(QuantizeDialog("SmolLM2", [64], probe))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: app.results == [None])
        assert probe.cancelled.is_set()
        probe.release.set()  # a report after the dialog closed is dropped
        await pilot.pause(0.2)


async def test_enter_before_the_estimate_or_after_a_failed_probe_asks_first():
    probe = FakeProbe([], error="RuntimeError: out of memory")
    app = DialogApp(QuantizeDialog("SmolLM2", [64], probe))
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_for(pilot, lambda: "probe failed" in _label(app, "awq"))
        assert "out of memory" in _text(app, "#estimate-detail")
        await pilot.press("r", "enter")
        await pilot.pause()
        assert "RTN's time on this machine is not known yet" in _text(app, "#confirm-text")
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.results == [QuantizeChoice("rtn", 64)])


async def test_a_probe_that_cannot_start_says_why_and_the_choice_stays():
    def broken(on_estimate, on_step, on_end):
        raise OSError("No space left on device")

    app = DialogApp(QuantizeDialog("SmolLM2", [64, 32], broken))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert "OSError: No space left on device" in _text(app, "#estimate-detail")
        assert "probe failed" in _label(app, "awq") and "probe failed" in _label(app, "rtn")
        await pilot.press("r", "enter", "enter")  # asked first (time unknown), then started
        assert await wait_for(pilot, lambda: app.results == [QuantizeChoice("rtn", 64)])


async def test_enter_on_the_cancel_button_cancels():
    app = DialogApp(QuantizeDialog("SmolLM2", [64], FakeProbe([SHORT])))
    async with app.run_test(size=(100, 30)) as pilot:
        app.screen.query_one("#cancel").focus()
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.results == [None])


def test_a_dialog_needs_a_group_size():
    with pytest.raises(ValueError):
        QuantizeDialog("x", [])
