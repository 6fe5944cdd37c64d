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
CACHE_ROOT = Path.home() / ".cache" / "kvdeck" / "llama.cpp"
START_TIMEOUT_S = 300.0
# kvdeck's KV cache dtype -> llama.cpp's cache type: the same precision on both sides.
KV_CACHE_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def find_bin_dir(explicit: str | None = None) -> Path:
    """The folder with `llama-server`: the flag, then $KVDECK_LLAMA_CPP_DIR/build/bin (the build
    script's cache), then the newest version under ~/.cache/kvdeck/llama.cpp."""
    if explicit:
        candidates = [Path(explicit)]
    elif os.environ.get("KVDECK_LLAMA_CPP_DIR"):
        candidates = [Path(os.environ["KVDECK_LLAMA_CPP_DIR"]) / "build" / "bin"]
    else:
        versions = sorted(CACHE_ROOT.glob("*/build/bin"), key=lambda p: _version_key(p.parents[1].name))
        candidates = versions[::-1]
    for folder in candidates:
        if (folder / SERVER_BINARY).is_file():
            return folder
    where = ", ".join(str(c) for c in candidates) or str(CACHE_ROOT)
    raise ValueError(f"no {SERVER_BINARY} in {where}; build it with `python benchmarks/llama_cpp.py build` "
                     "or name its folder with --llama-cpp-bin")


def _version_key(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("."))


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
                raise ValueError(f"{SERVER_BINARY} exited with {self.process.returncode}:\n{log}")
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
                       KV_CACHE_TYPES.get(kv_type or ""), shlex.split(args.llama_cpp_args)).start()


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
