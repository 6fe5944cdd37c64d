"""`kvdeck bench decode --contention N`: busy loops pinned, started for the busy turns and
stopped after (also on an error or ctrl+c), quiet and busy in turns, the busy/quiet ratio."""

import json
import os
from functools import partial

import pytest

from kvdeck.app.bench import contention as contention_module
from kvdeck.app.bench.contention import BusyLoops, Contention, busy_cpus
from kvdeck.app.cli import main
from tests.bench import test_bench_llama_cpp
from tests.bench.test_bench_llama_cpp import llama_flags, read_log

fake_llama = test_bench_llama_cpp.fake_llama  # the fixture: a fake llama-server


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_busy_cpus_are_the_last_allowed_ones():
    assert busy_cpus(1, {0, 1, 2, 3}) == [3]
    assert busy_cpus(2, {5, 1, 3}) == [3, 5]
    for count in (0, -1, 4):
        with pytest.raises(ValueError, match="--contention must be between 1 and the 3 CPUs"):
            busy_cpus(count, {0, 1, 2})


def test_busy_loops_are_pinned_while_running_and_reaped_after():
    cpu = busy_cpus(1)[0]
    with BusyLoops([cpu]) as loops:
        [process] = loops.processes
        assert process.poll() is None and os.sched_getaffinity(process.pid) == {cpu}
    assert process.returncode is not None and loops.processes == []
    assert (loops.started, loops.stopped) == (1, 1)


@pytest.mark.parametrize("error", [RuntimeError("the decode failed"), KeyboardInterrupt()])
def test_busy_loops_stop_on_an_error_and_on_ctrl_c(error):
    loops = BusyLoops(busy_cpus(1))
    with pytest.raises(type(error)), loops:
        pid = loops.processes[0].pid
        raise error
    assert loops.processes == [] and loops.stopped == 1 and _gone(pid)


class FakeLoops:
    """Stands for BusyLoops: counts starts and stops, and says whether it is running."""

    running = False
    log: list[str] = []

    def __init__(self, cpus):
        self.cpus = cpus

    def __enter__(self):
        FakeLoops.running = True
        FakeLoops.log.append(f"start {self.cpus}")
        return self

    def __exit__(self, *exc):
        FakeLoops.running = False
        FakeLoops.log.append("stop")


def test_turns_alternate_conditions_and_sides_and_the_ratio_is_quiet_over_busy():
    FakeLoops.log = []
    calls = []

    def side(name: str, quiet_s: float, busy_s: float):
        def run():
            calls.append((name, "busy" if FakeLoops.running else "quiet"))
            return busy_s if FakeLoops.running else quiet_s
        return run

    contention = Contention([1], settle_s=0.5, make_loops=FakeLoops, sleep=lambda s: None)
    runs = contention.turns({"kvdeck": side("kvdeck", 0.010, 0.020),
                             "baseline": side("baseline", 0.010, 0.500)}, repeats=3)
    assert calls == [("kvdeck", "quiet"), ("baseline", "quiet"), ("kvdeck", "busy"), ("baseline", "busy"),
                     ("baseline", "busy"), ("kvdeck", "busy"), ("baseline", "quiet"), ("kvdeck", "quiet"),
                     ("kvdeck", "quiet"), ("baseline", "quiet"), ("kvdeck", "busy"), ("baseline", "busy")]
    assert FakeLoops.log == ["start [1]", "stop"] * 3 and not FakeLoops.running
    figures = contention.figures(runs)
    assert figures["busy_processes"] == 1 and figures["busy_cpus"] == [1]
    assert figures["kvdeck"]["busy_over_quiet"]["median"] == pytest.approx(0.5)
    assert figures["baseline"]["busy_over_quiet"]["pairs"] == pytest.approx([0.02] * 3)
    assert figures["kvdeck"]["busy_output_tokens_per_s"] == pytest.approx(50.0)


def test_decode_with_contention_records_both_conditions(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    """The command end to end on the tiny model with the real busy loops: started for each busy
    turn, all stopped at the end; the JSON holds the runs and the ratio they give."""
    made: list[BusyLoops] = []

    class Recorded(BusyLoops):
        def __init__(self, cpus):
            super().__init__(cpus)
            made.append(self)

    monkeypatch.setattr(contention_module, "Contention",
                        partial(Contention, settle_s=0.05, make_loops=Recorded))
    out = tmp_path / "c.json"
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "8", "--output-len",
                 "5", "--repeats", "2", "--kv-cache-memory-gib", "0.01", "--contention", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    decode, busy = result["decode"], result["decode"]["contention"]
    assert result["config"]["contention"] == 1 and busy["busy_cpus"] == busy_cpus(1)
    kvdeck = busy["kvdeck"]
    assert decode["runs_time_per_output_token_s"] == kvdeck["runs_quiet_time_per_output_token_s"]
    assert len(kvdeck["runs_busy_time_per_output_token_s"]) == 2
    assert kvdeck["busy_over_quiet"]["pairs"] == pytest.approx(
        [q / b for q, b in zip(kvdeck["runs_quiet_time_per_output_token_s"],
                               kvdeck["runs_busy_time_per_output_token_s"])])
    assert "baseline" not in busy
    assert len(made) == 2 and all(m.started == m.stopped == 1 and m.processes == [] for m in made)
    assert "busy / quiet tokens/s" in capsys.readouterr().out


def test_a_failing_decode_stops_the_busy_loops(tiny_llama_dir, monkeypatch):
    made: list[BusyLoops] = []

    class Recorded(BusyLoops):
        def __init__(self, cpus):
            super().__init__(cpus)
            made.append(self)

    monkeypatch.setattr(contention_module, "Contention",
                        partial(Contention, settle_s=0.05, make_loops=Recorded))

    def broken(*args, **kwargs):
        if made:  # the warm-up passes; the first busy run fails
            raise KeyboardInterrupt
        return 0.01, [1, 2]

    monkeypatch.setattr("kvdeck.app.bench.decode.timed_decode", broken)
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "4", "--output-len", "3",
                 "--repeats", "2", "--kv-cache-memory-gib", "0.01", "--contention", "1"]) == 130  # ctrl+c
    assert len(made) == 1 and made[0].stopped == made[0].started == 1


def test_contention_is_refused_beyond_the_cpus(tiny_llama_dir, capsys):
    code = main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "4", "--output-len", "3",
                 "--kv-cache-memory-gib", "0.01", "--contention", str(len(os.sched_getaffinity(0)) + 1)])
    assert code == 2 and "--contention must be between 1" in capsys.readouterr().err



def test_with_llama_cpp_both_sides_get_a_ratio(tiny_llama_dir, fake_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(contention_module, "Contention", partial(Contention, settle_s=0.05))
    bin_dir, gguf, log = fake_llama
    out = tmp_path / "c.json"
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "8", "--output-len", "5",
                 "--repeats", "2", "--kv-cache-memory-gib", "0.01", "--contention", "1",
                 *llama_flags(bin_dir, gguf), "--out", str(out)]) == 0
    decode = json.loads(out.read_text())["decode"]
    busy = decode["contention"]
    # The fake server's timings are arithmetic: the busy core costs it nothing.
    assert busy["baseline"]["busy_over_quiet"]["pairs"] == [1.0, 1.0]
    quiet = busy["baseline"]["runs_quiet_time_per_output_token_s"]
    assert decode["baseline"]["runs_time_per_output_token_s"] == quiet
    prompts = [e["body"]["prompt"] for e in read_log(log) if e.get("path") == "/completion"]
    assert len(prompts) == 5  # a warm-up, then quiet and busy twice
