"""Progress that moves: steps inside each layer, the same bar in the CLI, no tokenizer noise."""

import io
import warnings

import torch
from transformers import AutoModelForCausalLM

from kvdeck.app.cli.quantize import TerminalProgress, step_line
from kvdeck.quant.awq_quantizer import AWQSettings, QuantizeProgress, QuantizeStep, quantize_awq
from kvdeck.quant.progress_text import format_duration, format_remaining, remaining_seconds


def test_steps_inside_the_layers_move_forward(group128_llama_dir, monkeypatch):
    monkeypatch.setattr("kvdeck.quant.awq_quantizer.STEP_REPORT_S", 0.0)  # every step
    model = AutoModelForCausalLM.from_pretrained(group128_llama_dir, dtype=torch.float32)
    ids = torch.randint(3, 200, (4, 32))
    settings = AWQSettings(group_size=128, n_grid=4)
    layers: list[QuantizeProgress] = []
    steps: list[QuantizeStep] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_awq(model, ids, settings, "cpu", layers.append, steps.append)
    # The layers are called as this transformers names its arguments: no deprecation notes.
    assert not [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    assert [e.layer for e in layers] == [1, 2]  # the per-layer callback is as it was
    fractions = [s.fraction for s in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert steps[0].what.startswith("capturing layer 1's inputs")
    whats = " | ".join(s.what for s in steps)
    for expected in ("layer 1/2: recording", "scale search, q/k/v (1/4)", "scale search, down",
                     "clip search, mlp.down_proj", "layer 2/2"):
        assert expected in whats
    # Half-way through the first layer is between 0 and 1/2: finer than whole layers.
    assert any(0 < f < 0.5 for f in fractions) and any(0.5 < f < 1 for f in fractions)


def test_progress_reads_as_durations_not_clock_times():
    assert format_duration(679) == "11 min 19 s" and format_duration(42) == "42 s"
    assert format_remaining(679) == "about 11 min left"
    assert format_remaining(20) == "less than a minute left"
    assert format_remaining(None) == "estimating the time left"
    assert remaining_seconds(0.25, 60.0) == 180.0 and remaining_seconds(0.001, 5.0) is None
    line = step_line(QuantizeStep(0.5, "layer 1/2: scale search, mlp (3/20)", 90.0))
    assert "50%" in line and "scale search" in line and "1 min 30 s elapsed" in line
    assert "about 2 min left" in line


def test_the_cli_redraws_steps_on_a_terminal_and_logs_them_in_a_file():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, log = Tty(), io.StringIO()
    for stream in (tty, log):
        bar = TerminalProgress(stream)
        for i in range(3):
            bar.step(QuantizeStep(0.1 * i, f"layer 1/2: step {i}", 10.0 * i))
        bar.layer(QuantizeProgress(1, 2, 30.0, 30.0))
    assert tty.getvalue().count("\r") == 4 and "layer 1/2 done" in tty.getvalue()
    assert log.getvalue().splitlines()[0].endswith("estimating the time left")
    assert len(log.getvalue().splitlines()) == 3  # steps 0 and 2 (15 s apart), the layer
