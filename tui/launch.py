"""The TUI's ways in: on an engine of its own (`kvdeck`), on running servers
(`kvdeck attach`), or on a recording (`kvdeck replay`, read-only). The engine's client is
imported here, lazily, so that importing the app imports no torch."""

from pathlib import Path
from typing import TYPE_CHECKING

from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.engine_session import display_model_name
from kvdeck.tui.engine_settings import TUI_DEFAULT_SPECULATION
from kvdeck.tui.settings_store import SettingsStore

if TYPE_CHECKING:
    from kvdeck.app.record.reader import Recording

RECORD_MAX_MB = 20.0


def run_tui(model: str | None, engine_kwargs: dict, default_speculation: bool = True,
            record_to: Path | None = None, record_max_mb: float = RECORD_MAX_MB) -> int:
    """Open the TUI; the engine starts in its background process once the window is up.
    Speculation is on (suffix drafts under the gain policy) unless the flags say otherwise."""

    from kvdeck.tui.engine_factory import real_client_factory
    from kvdeck.tui.settings_store import default_settings_path

    if default_speculation and engine_kwargs.get("speculative_config") is None:
        engine_kwargs = {**engine_kwargs, "speculative_config": dict(TUI_DEFAULT_SPECULATION)}
    app = KvdeckApp(real_client_factory(model, engine_kwargs), display_model_name(model),
                    model=model, settings_store=SettingsStore(default_settings_path()),
                    factory_for_model=real_client_factory, engine_options=engine_kwargs,
                    record_to=record_to, record_max_mb=record_max_mb)
    result = app.run()
    return int(result or 0)


def run_attached(urls: list[str], api_key: str | None, record_to: Path | None = None,
                 record_max_mb: float = RECORD_MAX_MB) -> int:
    """Open the TUI on running servers (`kvdeck attach`); no engine starts in this process."""
    from kvdeck.tui.attached_servers import AttachedServers
    from kvdeck.tui.settings_store import default_settings_path

    servers = AttachedServers(urls, api_key)
    app = KvdeckApp(servers.client_factory(), urls[0], model=None,
                    settings_store=SettingsStore(default_settings_path()), servers=servers,
                    record_to=record_to, record_max_mb=record_max_mb)
    return int(app.run() or 0)


def run_replay(recording: "Recording") -> int:
    """Open a recording's dashboard, read-only, with a time slider (`kvdeck replay FILE`)."""
    from kvdeck.tui.replay_app import ReplayApp

    try:
        return int(ReplayApp(recording).run() or 0)
    finally:
        recording.close()
