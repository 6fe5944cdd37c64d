"""A `kvdeck --serve` process for benchmarks: started on a free loopback port, waited for
until /health answers, terminated on exit."""

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.serve.conftest import free_port

START_TIMEOUT_S = 300.0


@contextmanager
def kvdeck_server(model: str, env: dict | None = None) -> Iterator[str]:
    """Yields the server's base URL once it is ready."""
    url = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen([sys.executable, "-m", "kvdeck.app.cli", "--serve", "--model", model,
                               "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1]],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(30)
