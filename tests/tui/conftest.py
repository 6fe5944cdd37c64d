"""Fixtures for the TUI tests: the app wired to the deterministic fake engine client."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvdeck.tui.app import KvdeckApp
from tests.tui.fake_engine import FakeEngineClient


class FakeFactory:
    """Makes fake clients (a restart makes a new one) and remembers them."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs
        self.clients: list[FakeEngineClient] = []

    def __call__(self) -> FakeEngineClient:
        client = FakeEngineClient(**self.kwargs)  # type: ignore[arg-type]
        self.clients.append(client)
        return client

    @property
    def client(self) -> FakeEngineClient:
        return self.clients[-1]


@pytest.fixture(autouse=True)
def kvdeck_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """kvdeck's settings, logs and model store in the test's own folder."""
    home = tmp_path / "kvdeck-home"
    monkeypatch.setenv("KVDECK_HOME", str(home))
    return home


@pytest.fixture
def make_app(tmp_path: Path) -> Callable[..., tuple[KvdeckApp, FakeFactory]]:
    def make(**fake_kwargs: object) -> tuple[KvdeckApp, FakeFactory]:
        factory = FakeFactory(**fake_kwargs)
        app = KvdeckApp(factory, model_name="fake-llama", transcript_dir=tmp_path / "chats")
        return app, factory

    return make


def load_requests_in_flight(client) -> int:
    """The fake engine's load-burst requests sent and not yet finished or aborted (a burst's
    tasks send them one by one: on a busy machine some may not be sent yet)."""
    return sum(request_id.startswith("load") for request_id in client.requests)


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 5.0,
                   step: float = 0.02) -> bool:
    """Let the app run until condition() holds (True) or timeout passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await pilot.pause(step)
    return condition()
