"""`kvdeck bench decode --baseline llama-bench`: llama.cpp's own `llama-bench` as the decode
baseline, where llama-server cannot run (or to hold its figure against the server's).

Each baseline run is one process, `llama-bench -m GGUF -t THREADS -p 0 -n OUTPUT_LEN -r 1
-o json`, in turns with kvdeck's runs as the server baseline's are (kvdeck.app.bench.pairs).
Its `tg` test decodes OUTPUT_LEN tokens one at a time; with `-d INPUT_LEN` (n_depth) they
follow a context of the prompt's length, as kvdeck's do. Its figure is the test's tokens per
second (`avg_ts`), so its time per token is 1 / avg_ts; it returns no tokens, so no greedy
comparison. --llama-cpp-repack passes through as `--repack 0|1`, and --llama-cpp-args too
(llama-server's --no-repack / -nr become `--repack 0`).
"""

import argparse
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvdeck.app.bench.llama_cpp import BENCH_BINARY, KV_CACHE_TYPES, extra_args, find_bin_dir, start_failure

RUN_TIMEOUT_S = 600.0
# llama-server's repack switch as llama-bench spells it.
SERVER_TO_BENCH_FLAGS = {"--no-repack": ["--repack", "0"], "-nr": ["--repack", "0"],
                         "--repack": ["--repack", "1"]}


@dataclass(slots=True)
class LlamaBench:
    """One llama-bench command: a tg test of `output_len` tokens after `depth` of context."""

    bin_dir: Path
    gguf: Path
    threads: int
    output_len: int
    depth: int = 0
    kv_type: str | None = None  # llama.cpp's cache type (f32, bf16, ...); None: its default
    repack: int | None = None  # --repack 0|1; None: its default
    extra_args: list[str] = field(default_factory=list)
    gguf_type: str | None = None

    @property
    def command(self) -> list[str]:
        command = [str(self.bin_dir / BENCH_BINARY), "-m", str(self.gguf), "-t", str(self.threads),
                   "-p", "0", "-n", str(self.output_len), "-r", "1", "-o", "json"]
        if self.depth:
            command += ["-d", str(self.depth)]
        if self.kv_type is not None:
            command += ["-ctk", self.kv_type, "-ctv", self.kv_type]
        if self.repack is not None:
            command += ["--repack", str(self.repack)]
        for arg in self.extra_args:
            command += SERVER_TO_BENCH_FLAGS.get(arg, [arg])
        return command

    def run(self) -> float:
        """One run: seconds per generated token."""
        if not Path(self.gguf).is_file():
            raise ValueError(f"--llama-cpp-gguf {self.gguf} is not a file; make it with "
                             "`python benchmarks/llama_cpp.py convert MODEL_DIR OUT.gguf`")
        done = subprocess.run(self.command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            log = (done.stderr + done.stdout)[-2000:]
            raise ValueError(start_failure(BENCH_BINARY, done.returncode, log, self.gguf_type,
                                           self.command[1:]))
        return 1.0 / tokens_per_s(done.stdout, self.output_len)


def tokens_per_s(output: str, output_len: int) -> float:
    """The tg test's tokens/s from llama-bench's `-o json` (a list of tests)."""
    try:
        tests = json.loads(output)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{BENCH_BINARY} printed no JSON ({exc}): {output[:200]!r}") from None
    for test in tests if isinstance(tests, list) else []:
        if int(test.get("n_gen", 0)) == output_len and int(test.get("n_prompt", 0)) == 0:
            return float(test["avg_ts"])
    raise ValueError(f"{BENCH_BINARY}'s JSON has no tg{output_len} test: {output[:200]!r}")


def decode_baseline(args: argparse.Namespace, input_len: int, output_len: int, threads: int,
                    kv_type: str) -> tuple[LlamaBench, Callable[[], tuple[float, list[int] | None]]]:
    """The llama-bench command and the call that runs it once: (seconds per token, no tokens)."""
    bench = LlamaBench(find_bin_dir(args.llama_cpp_bin, BENCH_BINARY), Path(args.llama_cpp_gguf),
                       args.llama_cpp_threads or threads, output_len, input_len,
                       KV_CACHE_TYPES.get(kv_type or ""), getattr(args, "llama_cpp_repack", None),
                       extra_args(args), getattr(args, "llama_cpp_gguf_type", None))

    def decode() -> tuple[float, list[int] | None]:
        return bench.run(), None

    return bench, decode
