"""Make the real engine client for the TUI (imported lazily: the UI starts without torch)."""

from __future__ import annotations

from kvdeck.tui.engine_protocol import ClientFactory, EngineClientProtocol


def engine_log_path() -> str:
    """The engine process's output goes here, never into the terminal the TUI draws on."""
    from kvdeck.app.store.paths import data_dir

    logs = data_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return str(logs / "engine.log")


def real_client_factory(model: str | None, engine_kwargs: dict) -> ClientFactory:
    def make_client() -> EngineClientProtocol:
        from kvdeck.engine.api.async_client import EngineClient

        return EngineClient(model, log_path=engine_log_path(), **engine_kwargs)

    return make_client
