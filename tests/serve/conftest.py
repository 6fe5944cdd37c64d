"""A live `kvdeck --serve` on loopback, one per test module, on the tiny random llama."""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.model_factory import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
KV_GIB = "0.01"  # ~1300 blocks of 16 tokens for the tiny model: plenty, and fast to allocate


@pytest.fixture(scope="session")
def serve_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("serve_model") / "llama", "llama")


@dataclass
class LiveServer:
    process: subprocess.Popen
    base_url: str
    log_path: Path
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def engine_pid(self) -> int | None:
        """The spawned engine-core process: a child of the server running spawn_main."""
        for pid in child_pids(self.process.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmdline:
                return pid
        return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def child_pids(parent: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model_dir: Path, log_dir: Path, *extra: str, api_key: str | None = None,
                 timeout: float = 120.0, port: int | None = None) -> LiveServer:
    port = port or free_port()
    args = [sys.executable, "-m", "kvdeck.app.cli", "--serve", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--kv-cache-memory-gib", KV_GIB, *extra]
    if api_key:
        args += ["--api-key", api_key]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    env.pop("KVDECK_API_KEY", None)
    log_path = log_dir / f"server-{port}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(process, f"http://127.0.0.1:{port}", log_path, api_key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    stop_server(server)
    raise RuntimeError(f"the server did not become ready in {timeout:.0f}s:\n{server.log()}")


def stop_server(server: LiveServer, hard: bool = False) -> None:
    """SIGTERM (graceful: the engine is shut down too), or SIGKILL (no chance to clean up:
    the engine notices its pipe closing). Either way the engine must not outlive it."""
    engine = server.engine_pid()
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
        try:
            server.process.wait(20)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(5)
            raise AssertionError(f"the server did not stop on SIGTERM:\n{server.log()}") from None
    if engine is not None:
        deadline = time.monotonic() + 10
        while _alive(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(engine), f"the engine process outlived the server (hard={hard})"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
