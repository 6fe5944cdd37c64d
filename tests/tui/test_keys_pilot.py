"""Keys go where the user means them: typing lands in the input whatever has focus, layout
changes never strand the focus, and quitting asks while something runs."""

from __future__ import annotations

from kvdeck.tui.screens.confirm_quit import ConfirmQuitScreen
from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.chat_input import ChatInput
from tests.tui.conftest import load_requests_in_flight, wait_for


async def test_typing_without_focus_reaches_the_chat_after_clicks_and_resizes(make_app):
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        screen = app.screen
        chat = screen.chat
        await pilot.click(BlockMap)
        assert isinstance(app.focused, BlockMap)
        await pilot.press(*"hi ")
        assert chat.prompt_input.text == "hi " and isinstance(app.focused, ChatInput)
        # Focus on the map, then a narrow terminal hides the map: typing still lands.
        screen.query_one(BlockMap).focus()
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.2)
        await pilot.press(*"there")
        assert chat.prompt_input.text == "hi there"
        # The layout toggle keeps a message being typed in view...
        await pilot.press("f2")
        assert chat.display and not screen.has_class("-show-dashboard")
        # ...and once it is sent, f2 shows the dashboard; typing brings the chat back.
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2
                              and not chat.generating)
        await pilot.press("f2")
        assert screen.has_class("-show-dashboard") and not chat.display
        await pilot.press(*"next")
        assert chat.display and chat.prompt_input.text == "next"
        # Dashboard in a narrow terminal, then wide again: both panes are in view.
        await pilot.press("ctrl+u")  # clear the input (Input's own binding)
        await pilot.press("f2")
        assert screen.has_class("-show-dashboard")
        await pilot.resize_terminal(160, 48)
        await pilot.pause(0.2)
        assert chat.display and screen.query_one("#dashboard").display
        await pilot.press(*"ok")
        assert chat.prompt_input.text == "ok"


async def test_quit_asks_while_a_reply_or_a_burst_runs(make_app):
    app, factory = make_app(token_delay=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        chat.prompt_input.text = "a long answer please"
        chat.focus_input()
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: chat.generating)
        await pilot.press("ctrl+q")
        assert await wait_for(pilot, lambda: isinstance(app.screen, ConfirmQuitScreen))
        assert "a chat reply is streaming" in app.screen.running[0]
        await pilot.press("n")  # stay: the reply goes on
        assert await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmQuitScreen))
        assert chat.generating and factory.client.shutdown_count == 0
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: not chat.generating)
        app.load_spec.num_requests = 4
        app.run_load(app.load_spec)
        assert await wait_for(pilot, lambda: app.load.running)
        assert await wait_for(pilot, lambda: load_requests_in_flight(factory.client) == 4)
        await pilot.press("ctrl+c")
        assert await wait_for(pilot, lambda: isinstance(app.screen, ConfirmQuitScreen))
        assert "load burst of 4" in app.screen.running[0]
        await pilot.press("y")
        assert await wait_for(pilot, lambda: factory.client.shutdown_count == 1)
    assert len(factory.client.aborted_ids) >= 5  # the reply, then the burst's four


async def test_quit_with_nothing_running_does_not_ask(make_app):
    app, factory = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await pilot.press("ctrl+q")
        assert await wait_for(pilot, lambda: factory.client.shutdown_count == 1)
