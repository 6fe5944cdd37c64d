"""The multi-line chat input: a paste keeps every line, Enter sends, ctrl+j adds a line, the
box grows with the message and shrinks back once it is sent."""

from __future__ import annotations

from textual import events
from textual.widgets import Static

from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.chat_input import MAX_VISIBLE_LINES, ChatInput
from kvdeck.tui.widgets.chat_message import ChatMessage
from tests.tui.conftest import wait_for

SNIPPET = "def square(x):\n    # the indentation is part of the code\n    return x * x"


def user_messages(app) -> list[ChatMessage]:
    return list(app.screen.query(ChatMessage).filter(".-user"))


async def test_a_pasted_snippet_is_sent_whole_and_shown_line_for_line(make_app):
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        prompt = chat.prompt_input
        assert app.focused is prompt
        # What the terminal's bracketed paste delivers: the app hands it to the focused widget.
        app.post_message(events.Paste(SNIPPET))
        assert await wait_for(pilot, lambda: prompt.text == SNIPPET)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2
                              and not chat.generating)
        assert factory.client.last_messages[-1] == {"role": "user", "content": SNIPPET}
        assert chat.transcript.turns[0].content == SNIPPET
        saved = app.transcript_store.load(chat.transcript.id)
        assert saved.turns[0].content == SNIPPET
        # The transcript shows the three lines as typed, indentation included.
        body = user_messages(app)[0].query_one(".user-text", Static)
        assert str(body.render()).splitlines() == SNIPPET.splitlines()
        assert body.size.height == 3
        assert prompt.text == ""


async def test_ctrl_j_adds_a_line_enter_sends_and_the_box_grows_then_shrinks(make_app):
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        prompt = chat.prompt_input
        one_line = prompt.size.height
        await pilot.press(*"first", "ctrl+j", *"second", "shift+enter", *"third")
        assert prompt.text == "first\nsecond\nthird"
        assert factory.client.sent == []  # a new line is not a send
        await pilot.pause()
        assert prompt.size.height == one_line + 2
        # It stops growing at MAX_VISIBLE_LINES and scrolls instead.
        for _ in range(12):
            await pilot.press("ctrl+j", "x")
        await pilot.pause()
        assert prompt.size.height == one_line + MAX_VISIBLE_LINES - 1
        assert prompt.max_scroll_y > 0
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2
                              and not chat.generating)
        sent = factory.client.last_messages[-1]["content"]
        assert sent.splitlines()[:3] == ["first", "second", "third"]
        assert len(sent.splitlines()) == 15
        await pilot.pause()
        assert prompt.text == "" and prompt.size.height == one_line


async def test_a_paste_with_the_map_focused_goes_to_the_input_and_blank_edges_are_dropped(
        make_app):
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        await pilot.click(BlockMap)
        assert isinstance(app.focused, BlockMap)
        app.post_message(events.Paste(f"\n\n{SNIPPET}\n\n"))
        assert await wait_for(pilot, lambda: isinstance(app.focused, ChatInput))
        assert chat.prompt_input.text == f"\n\n{SNIPPET}\n\n"  # pasted once, not twice
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2)
        assert factory.client.last_messages[-1]["content"] == SNIPPET
