"""Engine start-up, failure, restart, crash and quit, with the fake client."""

from __future__ import annotations

from textual.widgets import Static

from kvdeck.tui.screens.confirm_quit import ConfirmQuitScreen
from kvdeck.tui.screens.deck import DeckScreen
from kvdeck.tui.screens.engine_error import EngineErrorScreen
from kvdeck.tui.screens.help import HelpScreen
from kvdeck.tui.screens.startup import StartupScreen
from tests.tui.conftest import wait_for


async def test_startup_shows_progress_then_the_deck(make_app):
    app, factory = make_app(startup_delay=0.3)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: isinstance(app.screen, StartupScreen))
        startup = app.screen
        assert app.sub_title == "fake-llama"  # one title, before and after the engine is up
        assert await wait_for(pilot, lambda: "loading" in startup.stages_seen)
        assert "loading weights" in str(startup.query_one("#startup-stage", Static).render())
        assert await wait_for(pilot, lambda: app.engine_ready)
        assert await wait_for(pilot, lambda: isinstance(app.screen, DeckScreen))
        assert startup.stages_seen == ["starting", "loading", "profiling", "ready"]
        assert app.sub_title == "fake-llama"


async def test_failed_start_shows_the_error_and_restart_recovers(make_app):
    app, factory = make_app(fail_start="CUDA out of memory while loading weights")
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: isinstance(app.screen, EngineErrorScreen))
        assert "CUDA out of memory" in app.screen.detail
        assert not app.engine_ready
        factory.kwargs["fail_start"] = None  # the next start works
        await pilot.press("r")
        assert await wait_for(pilot, lambda: app.engine_ready)
        assert await wait_for(pilot, lambda: isinstance(app.screen, DeckScreen))
        assert len(factory.clients) == 2 and factory.clients[0].shutdown_count == 1


async def test_engine_crash_mid_run_is_reported_not_hung(make_app):
    app, factory = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        factory.client.crash()
        assert await wait_for(pilot, lambda: isinstance(app.screen, EngineErrorScreen))
        assert "died" in app.screen.detail or "fake crash" in app.screen.detail
        await pilot.click("#restart")
        assert await wait_for(pilot, lambda: app.engine_ready)
        assert await wait_for(pilot, lambda: app.dashboard_state.stats is not None)


async def test_quit_stops_the_engine(make_app):
    app, factory = make_app(token_delay=0.2)  # still streaming when the answer comes
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        app.screen.query_one("#prompt").focus()
        await pilot.press("q")  # typing q in the input is text, not quit
        assert app.screen.query_one("#prompt").text == "q"
        await pilot.press("enter")
        chat = app.screen.chat
        assert await wait_for(pilot, lambda: chat.generating)
        await pilot.press("ctrl+c")  # from anywhere; a reply is streaming, so it asks
        assert await wait_for(pilot, lambda: isinstance(app.screen, ConfirmQuitScreen))
        await pilot.press("y")  # quits, saving the partial reply
        assert await wait_for(pilot, lambda: factory.client.shutdown_count == 1)
    assert app.return_code == 0
    assert factory.client.aborted_ids  # the streaming reply was stopped first
    saved = app.transcript_store.list()
    assert len(saved) == 1 and saved[0].turns[-1].role == "assistant"


async def test_help_lists_every_binding_and_all_have_ids(make_app):
    from kvdeck.tui.app import KvdeckApp
    from kvdeck.tui.screens.chat_settings import ChatSettingsScreen
    from kvdeck.tui.screens.engine_error import EngineErrorScreen as ErrorScreen
    from kvdeck.tui.screens.load_generator import LoadGeneratorScreen
    from kvdeck.tui.screens.models_screen import ConfirmDeleteScreen, ModelsScreen
    from kvdeck.tui.screens.transcript_picker import TranscriptPickerScreen
    from kvdeck.tui.widgets.chat_message import ChatMessage
    from kvdeck.tui.widgets.model_tables import LocalModelsTable, RecommendedTable

    for owner in (KvdeckApp, DeckScreen, ErrorScreen, HelpScreen, StartupScreen,
                  ChatSettingsScreen, ConfirmQuitScreen, ModelsScreen, ConfirmDeleteScreen,
                  LocalModelsTable, RecommendedTable,
                  LoadGeneratorScreen, TranscriptPickerScreen, ChatMessage):
        for binding in owner.BINDINGS:
            assert binding.id, f"{owner.__name__} binding {binding.key} has no id"
    app, factory = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await pilot.press("f1")
        assert await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        listed = [b.id for _, group in app.screen.groups for b in group]
        for binding in (*KvdeckApp.BINDINGS, *DeckScreen.BINDINGS):
            # next_server: only attached to several servers; engine_settings: only where the
            # app can make an engine with other options (this one has no factory_for_model).
            if binding.id in ("next_server", "engine_settings"):
                assert binding.id not in listed
                continue
            assert binding.id in listed
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: isinstance(app.screen, DeckScreen))


async def test_command_palette_offers_the_apps_actions(make_app):
    app, factory = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Load test", "New", "Settings", "Help", "Go to Deck", "Stop load burst",
                      "Light/dark", "Open chat", "Copy reply"):
            assert title in titles
        await pilot.press("ctrl+p")
        await pilot.press(*"light/dark")
        await pilot.pause(0.3)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: app.theme == "textual-light")


async def test_switch_model_restarts_the_engine_on_the_new_model(tmp_path):
    from kvdeck.tui.app import KvdeckApp
    from tests.tui.conftest import FakeFactory

    made: list[FakeFactory] = []

    def factory_for_model(name: str, options: dict) -> FakeFactory:
        made.append(FakeFactory(model_name=name))
        return made[-1]

    first = FakeFactory()
    app = KvdeckApp(first, model_name="fake-llama", transcript_dir=tmp_path,
                    factory_for_model=factory_for_model)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        app.switch_model(str(tmp_path))  # a local directory shows as its folder name
        assert await wait_for(pilot, lambda: made and made[0].clients and app.engine_ready)
        assert first.client.shutdown_count == 1 and first.client.status == "stopped"
        assert app.client is made[0].client
        assert app.sub_title == tmp_path.name
        assert await wait_for(pilot, lambda: app.dashboard_state.stats is not None)


async def test_quit_during_startup_stops_the_starting_engine(make_app):
    app, factory = make_app(startup_delay=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: isinstance(app.screen, StartupScreen))
        assert await wait_for(pilot, lambda: bool(factory.clients))
        await pilot.press("q")  # the start-up screen is modal, but q still quits
        assert await wait_for(pilot, lambda: factory.client.shutdown_count == 1)
    assert not app.engine_ready
