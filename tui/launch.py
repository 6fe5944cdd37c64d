"""The TUI's two ways in: on an engine of its own (`kvdeck`) or on running servers
(`kvdeck attach`). The engine's client is imported here, lazily, so that importing the app
imports no torch."""

from kvdeck.tui.app import KvdeckApp
from kvdeck.tui.engine_session import display_model_name
from kvdeck.tui.settings_store import SettingsStore


def run_tui(model: str | None, engine_kwargs: dict) -> int:
    """Open the TUI; the engine starts in its background process once the window is up."""

    from kvdeck.tui.engine_factory import real_client_factory
    from kvdeck.tui.settings_store import default_settings_path

    app = KvdeckApp(real_client_factory(model, engine_kwargs), display_model_name(model),
                    model=model, settings_store=SettingsStore(default_settings_path()),
                    factory_for_model=real_client_factory, engine_options=engine_kwargs)
    result = app.run()
    return int(result or 0)


def run_attached(urls: list[str], api_key: str | None) -> int:
    """Open the TUI on running servers (`kvdeck attach`); no engine starts in this process."""
    from kvdeck.tui.attached_servers import AttachedServers
    from kvdeck.tui.settings_store import default_settings_path

    servers = AttachedServers(urls, api_key)
    app = KvdeckApp(servers.client_factory(), urls[0], model=None,
                    settings_store=SettingsStore(default_settings_path()), servers=servers)
    return int(app.run() or 0)
