"""Serving benchmark on this machine: start `kvdeck --serve` on loopback, drive it with
`kvdeck bench serve` (Poisson arrivals, streaming), stop it, keep the JSON.

    python benchmarks/bench_serving.py --model tiny --request-rate 4 --num-prompts 120 \\
        --out benchmarks/results/serving_tiny_cpu.json

`--model tiny` builds the tests' tiny random Llama; otherwise give a model directory
(default: the bundled demo model). Every other flag goes to `kvdeck bench serve`.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str | None, engine_args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "kvdeck.app.cli", "--serve", "--port", str(port), *engine_args]
    if model:
        cmd += ["--model", model]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log.open("wb"),
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise SystemExit("the server did not become ready within 300 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="'tiny', a model directory, or the demo model")
    parser.add_argument("--engine-args", default="--kv-cache-memory-gib 0.05",
                        help="extra flags for kvdeck --serve")
    args, bench_args = parser.parse_known_args()
    sys.path.insert(0, str(REPO_ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model == "tiny":
            from tests.model_factory import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny", "llama"))
        process, url = start_server(model, args.engine_args.split(), Path(tmp) / "server.log")
        try:
            from kvdeck.app.cli import main as kvdeck

            return kvdeck(["bench", "serve", "--base-url", url, *bench_args])
        finally:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    sys.exit(main())
