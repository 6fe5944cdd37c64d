"""The llama.cpp baseline compares like with like: an INT4 model's default GGUF is the 4-bit
file it came from, llama.cpp flags that start with a dash pass through, a llama-server killed
by a signal in its weight repack says how to run without it, llama-bench stands in where the
server cannot run, and the roofline counts the bytes an INT4 step reads (its tiles)."""

import json
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from kvdeck.app.bench.baseline_gguf import NEEDS_GGUF, choose_baseline_gguf
from kvdeck.app.bench.llama_bench import tokens_per_s
from kvdeck.app.bench.llama_cpp import extra_args, start_failure
from kvdeck.app.cli import build_parser, main
from tests.bench import fake_llama_server
from tests.bench.fake_llama_server import FAKE_MS_PER_TOKEN

FAKE = Path(fake_llama_server.__file__)


def write_gguf_header(path: Path, file_type) -> Path:
    """A GGUF with one tensor whose general.file_type is `file_type` (what the choice reads)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny")
    writer.add_block_count(1)
    writer.add_file_type(file_type)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def int4_store(tiny_llama_dir, tmp_path_factory):
    """A kvdeck home whose store holds `tiny` (imported from a Q4_1 GGUF, as the registry
    records) and `tiny-rtn`, quantised from it by `kvdeck quantize`."""
    from gguf import LlamaFileType

    from kvdeck.app.store import registry

    home = tmp_path_factory.mktemp("kvdeck-home")
    patch = pytest.MonkeyPatch()
    patch.setenv("KVDECK_HOME", str(home))
    try:
        dense = home / "models" / "tiny"
        shutil.copytree(tiny_llama_dir, dense)
        gguf = write_gguf_header(home / "tiny.Q4_1.gguf", LlamaFileType.MOSTLY_Q4_1)
        registry.mark_verified(registry.store_key("tiny"), {
            "path": str(dense), "method": "gguf-import", "gguf_file": str(gguf),
            "gguf_quantization": "Q4_1", "origin": "test"})
        assert main(["quantize", "tiny", "--method", "rtn", "--group-size", "64", "--device", "cpu"]) == 0
        yield home, dense, home / "models" / "tiny-rtn", gguf
    finally:
        patch.undo()


@pytest.fixture
def in_store(int4_store, monkeypatch):
    monkeypatch.setenv("KVDECK_HOME", str(int4_store[0]))
    return int4_store


def fake_bin(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """llama-server and llama-bench that are the fake; its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, sub in (("llama-server", ""), ("llama-bench", " bench")):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}"{sub} "$@"\n')
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "fake.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    return bin_dir, log


def argv_lines(log: Path) -> list[list[str]]:
    return [entry["argv"] for entry in map(json.loads, log.read_text().splitlines()) if "argv" in entry]


def namespace(**values):
    from argparse import Namespace

    return Namespace(**{"llama_cpp_gguf": None, **values})


def test_an_int4_model_runs_against_the_4bit_gguf_it_was_made_from(in_store, tmp_path, monkeypatch,
                                                                   capsys):
    _, dense, int4, gguf = in_store
    chosen = choose_baseline_gguf(namespace(), int4)
    assert chosen.path == gguf and chosen.quantization == "Q4_1"
    assert "quantised from tiny" in chosen.chosen_because
    with pytest.raises(ValueError, match="--llama-cpp-gguf"):  # a dense model: as before
        choose_baseline_gguf(namespace(), dense)

    bin_dir, log = fake_bin(tmp_path, monkeypatch)
    out = tmp_path / "d.json"
    assert main(["bench", "decode", "--model", str(int4), "--input-len", "8", "--output-len", "4",
                 "--repeats", "1", "--kv-cache-memory-gib", "0.01", "--baseline", "llama.cpp",
                 "--llama-cpp-bin", str(bin_dir), "--llama-cpp-threads", "1",
                 "--llama-cpp-args", "--no-repack", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"llama.cpp baseline: {gguf} (Q4_1;" in err
    (argv,) = argv_lines(log)
    assert argv[argv.index("-m") + 1] == str(gguf) and argv[-1] == "--no-repack"
    baseline = json.loads(out.read_text())["config"]["baseline"]
    assert baseline["gguf"] == str(gguf) and baseline["gguf_type"] == "Q4_1"
    assert baseline["tool"] == "llama-server" and baseline["llama_cpp_args"] == ["--no-repack"]


def test_without_a_4bit_gguf_the_error_says_how_to_make_one(in_store):
    from gguf import LlamaFileType

    home, dense, int4, gguf = in_store
    f16 = write_gguf_header(home / "tiny.f16.gguf", LlamaFileType.MOSTLY_F16)
    from kvdeck.app.store import registry

    record = registry.read()["verified"][registry.store_key("tiny")]
    registry.mark_verified(registry.store_key("tiny"), {**record, "gguf_file": str(f16),
                                                        "gguf_quantization": "F16"})
    try:
        with pytest.raises(ValueError) as caught:
            choose_baseline_gguf(namespace(), int4)
    finally:
        registry.mark_verified(registry.store_key("tiny"), record)
    message = str(caught.value)
    assert f"{f16} (F16)" in message and "--llama-cpp-gguf" in message
    assert f"python benchmarks/llama_cpp.py quantize {dense.resolve()} OUT.gguf --type Q4_1" in message
    assert NEEDS_GGUF.startswith("--baseline llama.cpp needs --llama-cpp-gguf")


@pytest.mark.parametrize(("flags", "expected"), [
    (["--llama-cpp-args=--no-repack"], ["--no-repack"]),
    (["--llama-cpp-args", "--no-repack"], ["--no-repack"]),
    (["--llama-cpp-args", "--no-repack --poll 0"], ["--no-repack", "--poll", "0"]),
    (["--llama-cpp-args", "-nr", "--llama-cpp-args=--poll 0"], ["-nr", "--poll", "0"]),
    ([], []),
])
def test_llama_cpp_args_take_values_that_start_with_a_dash(flags, expected):
    argv = ["bench", "decode", "--baseline", "llama.cpp", *flags, "--output-len", "5"]
    args = build_parser(argv).parse_args(argv)
    assert extra_args(args) == expected and args.output_len == 5


def test_a_server_killed_in_its_repack_suggests_no_repack(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    bin_dir, _ = fake_bin(tmp_path, monkeypatch)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("FAKE_LLAMA_SIGNAL", "11")
    code = main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "4", "--output-len", "3",
                 "--repeats", "1", "--kv-cache-memory-gib", "0.01", "--baseline", "llama.cpp",
                 "--llama-cpp-bin", str(bin_dir), "--llama-cpp-gguf", str(gguf)])
    err = capsys.readouterr().err
    assert code == 2
    assert "llama-server was killed by SIGSEGV (-11)" in err and "CPU_REPACK" in err
    assert "--llama-cpp-args=--no-repack" in err
    # No repack in the log: the GGUF's type says whether llama.cpp repacks it.
    assert "--no-repack" in start_failure("llama-server", -4, "", "Q4_1", [])
    assert "--no-repack" not in start_failure("llama-server", -4, "", "F32", [])
    assert "--no-repack" not in start_failure("llama-server", -11, "repack", "Q4_0", ["--no-repack"])
    assert "--no-repack" not in start_failure("llama-server", 1, "repack", "Q4_0", [])


def test_llama_bench_runs_in_turns_with_kvdeck(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    bin_dir, log = fake_bin(tmp_path, monkeypatch)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "b.json"
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--input-len", "12", "--output-len",
                 "6", "--repeats", "3", "--kv-cache-memory-gib", "0.01", "--baseline", "llama-bench",
                 "--llama-cpp-bin", str(bin_dir), "--llama-cpp-gguf", str(gguf), "--llama-cpp-threads",
                 "1", "--llama-cpp-repack", "0", "--out", str(out)]) == 0
    assert "llama-bench returns no tokens" in capsys.readouterr().out
    runs = argv_lines(log)
    assert len(runs) == 4  # its warm-up, then one per pair
    argv = runs[0]
    for flag, value in (("-m", str(gguf)), ("-t", "1"), ("-p", "0"), ("-n", "6"), ("-r", "1"),
                        ("-o", "json"), ("-d", "12"), ("--repack", "0"), ("-ctk", "f32")):
        assert argv[argv.index(flag) + 1] == value
    result = json.loads(out.read_text())
    decode = result["decode"]
    assert decode["baseline"]["runs_time_per_output_token_s"] == pytest.approx([FAKE_MS_PER_TOKEN / 1e3] * 3)
    assert decode["ratio"]["pairs"] == pytest.approx(
        [FAKE_MS_PER_TOKEN / 1e3 / k for k in decode["runs_time_per_output_token_s"]])
    assert "greedy_tokens_in_common" not in decode
    baseline = result["config"]["baseline"]
    assert baseline["tool"] == "llama-bench" and baseline["repack"] == 0
    assert baseline["command"][0].endswith("llama-bench") and "--repack" in baseline["command"]


def test_llama_bench_json_parsing():
    output = json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0},
                         {"n_prompt": 0, "n_gen": 16, "avg_ts": 80.5}])
    assert tokens_per_s(output, 16) == 80.5
    with pytest.raises(ValueError, match="no tg8 test"):
        tokens_per_s(output, 8)
    with pytest.raises(ValueError, match="no JSON"):
        tokens_per_s("| model | size |", 16)


def test_the_roofline_counts_an_int4_models_tiles(in_store):
    from kvdeck import LLM
    from kvdeck.app.bench.decode import decode_weight_bytes
    from kvdeck.kernels.cpu import int4 as cpu_int4

    if not cpu_int4.available():
        pytest.skip("this CPU has no INT4 kernels: the AutoAWQ tensors stay, and are counted")
    int4 = in_store[2]
    llm = LLM(str(int4), kv_cache_memory_gib=0.01, max_model_len=32)
    model = llm.engine.core.runner.model
    tiles = [m.int4.nbytes for m in model.modules() if getattr(m, "int4", None) is not None]
    assert len(tiles) == 2 * 4  # qkv, o, gate_up, down in each of 2 layers
    head = model.lm_head.tiles.tiles.numel()  # the int8 head, not the (tied or not) dense weight
    norms = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "norm" in name)
    config = json.loads((int4 / "config.json").read_text())
    assert config["tie_word_embeddings"] is False  # lm_head's own dense weight is left out too
    assert decode_weight_bytes(llm) == sum(tiles) + head + norms
    llm.shutdown()
