"""The chat pane driven with the Pilot against the fake engine client."""

from __future__ import annotations

import json

import pytest
from textual.widgets import Input, Markdown

from kvdeck.tui.screens.chat_settings import ChatSettingsScreen
from kvdeck.tui.screens.transcript_picker import TranscriptPickerScreen
from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.chat_input import ChatInput
from kvdeck.tui.widgets.chat_message import ChatMessage
from tests.tui.conftest import wait_for
from tests.tui.fake_engine import REPLY


def replies(app) -> list[ChatMessage]:
    return list(app.screen.query(ChatMessage).filter(".-assistant"))


async def send(pilot, text: str) -> None:
    pilot.app.screen.query_one("#prompt", ChatInput).focus()
    await pilot.press(*text)
    await pilot.press("enter")


async def test_reply_streams_in_and_map_shows_its_blocks(make_app):
    app, factory = make_app(token_delay=0.08)  # slow enough to see it half-way
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await send(pilot, "hello engine")
        chat = app.screen.chat
        assert await wait_for(pilot, lambda: chat.active_request_id is not None)
        request_id = chat.active_request_id
        block_map = app.screen.query_one(BlockMap)
        # While it streams, the map shows blocks owned by this request and the text grows.
        assert await wait_for(pilot, lambda: block_map.cells is not None
                              and request_id in block_map.cells.owners)
        assert await wait_for(pilot, lambda: 0 < len(replies(app)[0].markdown.source)
                              < len(REPLY.strip()))
        assert await wait_for(pilot, lambda: not chat.generating, timeout=10)
        reply = replies(app)[0]
        assert reply.content.strip() == REPLY.strip()
        assert "Paged attention" in reply.markdown.source
        stats_text = str(reply.query_one(".reply-stats").render())
        assert "TTFT" in stats_text and "tok/s" in stats_text and "tokens" in stats_text
        # Finished: its blocks are released in the engine and then in the map.
        assert await wait_for(pilot, lambda: request_id not in block_map.cells.owners)
        saved = list((app.transcript_store.directory).glob("*.json"))
        assert len(saved) == 1
        data = json.loads(saved[0].read_text())
        assert [t["role"] for t in data["turns"]] == ["user", "assistant"]
        assert data["turns"][1]["content"] == reply.content


async def test_escape_stops_the_reply_and_keeps_the_partial_text(make_app):
    app, factory = make_app(token_delay=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await send(pilot, "tell me about paging")
        chat = app.screen.chat
        assert await wait_for(pilot, lambda: len(replies(app)[0].markdown.source) > 10)
        request_id = chat.active_request_id
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: not chat.generating)
        assert factory.client.aborted_ids == [request_id]
        assert request_id not in factory.client.requests  # its blocks were freed at once
        reply = replies(app)[0]
        assert 0 < len(reply.content) < len(REPLY)
        assert "stopped" in str(reply.query_one(".reply-stats").render())
        assert chat.transcript.turns[-1].content == reply.content


async def test_multi_turn_sends_the_whole_conversation_with_the_system_prompt(make_app):
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        await send(pilot, "first")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2)
        await send(pilot, "second")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 4)
        messages = factory.client.last_messages
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
        assert messages[0]["content"] == app.chat_settings.system_prompt
        assert messages[1]["content"] == "first" and messages[3]["content"] == "second"
        assert messages[2]["content"] == REPLY


async def test_settings_modal_validates_and_applies_sampling_and_system_prompt(make_app):
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(100, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await pilot.press("ctrl+s")
        assert await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        modal = app.screen
        modal.query_one("#temperature", Input).value = "hot"
        modal.action_save()
        await pilot.pause()
        assert "temperature must be a number" in str(modal.query_one("#settings-error").render())
        modal.query_one("#temperature", Input).value = "0"
        modal.query_one("#top-p", Input).value = "1.5"
        modal.action_save()
        await pilot.pause()
        assert "top_p" in str(modal.query_one("#settings-error").render())
        modal.query_one("#top-p", Input).value = "0.5"
        modal.query_one("#max-tokens", Input).value = "5"
        modal.query_one("#seed", Input).value = "42"
        modal.query_one("#system-prompt").text = "Answer like a pirate."
        modal.action_save()
        assert await wait_for(pilot, lambda: app.chat_settings.seed == 42)
        assert (app.chat_settings.temperature, app.chat_settings.top_p) == (0.0, 0.5)
        assert (app.chat_settings.max_tokens, app.chat_settings.seed) == (5, 42)
        await send(pilot, "hi")
        chat = app.screen.chat
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2)
        params = factory.client.last_params
        assert (params.temperature, params.top_p, params.max_tokens, params.seed) == (
            0.0, 0.5, 5, 42)
        assert factory.client.last_messages[0] == {"role": "system",
                                                   "content": "Answer like a pirate."}
        assert "max tokens" in chat.transcript.turns[1].stats  # finished by max_tokens=5


async def test_response_format_schema_from_a_file_reaches_the_request(make_app, tmp_path):
    """Structured output in the chat: a JSON schema from a file holds the reply; a bad file is refused in the
    form with its reason, and the status line says which format is on."""
    from textual.widgets import Select

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    good = tmp_path / "city.json"
    good.write_text(json.dumps(schema))
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "nonsense"}}}))
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(120, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await pilot.press("ctrl+s")
        assert await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        modal = app.screen
        modal.query_one("#response-format", Select).value = "schema"
        modal.action_save()
        await pilot.pause()
        assert "needs the schema's file" in str(modal.query_one("#settings-error").render())
        for path, reason in ((bad, "is not JSON"), (tmp_path / "missing.json", "cannot read"),
                             (invalid, f"the schema in {invalid} is not valid")):
            modal.query_one("#schema-file", Input).value = str(path)
            modal.action_save()
            await pilot.pause()
            assert reason in str(modal.query_one("#settings-error").render()), reason
        modal.query_one("#schema-file", Input).value = str(good)
        modal.action_save()
        assert await wait_for(pilot, lambda: app.chat_settings.response_format == "schema")
        chat = app.screen.chat
        assert "schema city.json" in str(chat.query_one("#chat-status").render())
        await send(pilot, "where?")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2)
        constraint = factory.client.last_params.structured_outputs
        assert constraint.kind == "json" and json.loads(constraint.json) == schema
    # The format is kept with the other settings.
    assert app.settings.current.schema_file == str(good)


async def test_new_chat_then_reopen_the_saved_transcript_and_copy(make_app):
    app, factory = make_app(token_delay=0.0)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        await send(pilot, "remember me")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2)
        first_id = chat.transcript.id
        await pilot.press("ctrl+y")
        assert app.clipboard == REPLY
        user_message = app.screen.query(ChatMessage).filter(".-user").first()
        user_message.focus()
        await pilot.press("c")  # copy the focused message
        assert app.clipboard == "remember me"
        await pilot.press("ctrl+n")
        assert await wait_for(pilot, lambda: chat.transcript.id != first_id)
        assert not replies(app)
        await pilot.press("ctrl+o")
        assert await wait_for(pilot, lambda: isinstance(app.screen, TranscriptPickerScreen))
        await pilot.press("enter")  # the newest (only) saved chat
        assert await wait_for(pilot, lambda: chat.transcript.id == first_id)
        assert await wait_for(pilot, lambda: len(replies(app)) == 1)
        assert replies(app)[0].query_one(Markdown).source == REPLY
        # Continuing the reopened chat sends its earlier turns.
        await send(pilot, "again")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 4)
        assert factory.client.last_messages[1]["content"] == "remember me"


async def test_a_streaming_reply_is_saved_before_it_finishes(make_app):
    app, factory = make_app(token_delay=0.12)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await send(pilot, "a long answer please")
        chat = app.screen.chat

        def saved_partial() -> bool:
            saved = app.transcript_store.list()
            return bool(saved) and len(saved[0].turns) == 2 and bool(saved[0].turns[1].content)
        assert await wait_for(pilot, saved_partial, timeout=6)
        assert chat.generating  # saved while the reply was still streaming
        partial = app.transcript_store.list()[0].turns[1].content
        assert REPLY.startswith(partial) and len(partial) < len(REPLY)
        await pilot.press("escape")
        assert await wait_for(pilot, lambda: not chat.generating)


async def test_a_refused_request_ends_the_reply_at_once_and_says_why(make_app):
    app, factory = make_app(token_delay=0.0, reject="the engine refused this request")
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        await send(pilot, "hello")
        assert await wait_for(pilot, lambda: not chat.generating
                              and "refused" in replies(app)[0].stats)
        assert "error" in chat.transcript.turns[-1].stats
        # The input is usable again at once: the next message goes out.
        factory.client.reject = None
        await send(pilot, "again")
        assert await wait_for(pilot, lambda: len(replies(app)) == 2 and not chat.generating)
        assert replies(app)[1].content == REPLY
        await pilot.press("ctrl+n")
        assert await wait_for(pilot, lambda: not replies(app))


async def test_a_message_longer_than_the_context_is_refused_before_sending(make_app):
    app, factory = make_app(token_delay=0.0, max_model_len=64)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        long_text = " ".join(f"w{i}" for i in range(70))
        chat.prompt_input.text = long_text
        chat.focus_input()
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert factory.client.sent == [] and not chat.generating and not replies(app)
        assert chat.prompt_input.text == long_text  # kept, to shorten
        tokens = len(factory.client.encode(None, [
            {"role": "system", "content": app.chat_settings.system_prompt},
            {"role": "user", "content": long_text}])[1])
        status = str(chat.query_one("#chat-status").render())
        assert f"not sent: {tokens} tokens" in status
        assert any(f"{tokens} tokens" in n.message and "context is 64" in n.message
                   for n in app._notifications)
        chat.prompt_input.text = ""
        await send(pilot, "short one")
        assert await wait_for(pilot, lambda: len(replies(app)) == 1 and not chat.generating)
        prompt, max_tokens = factory.client.sent[0]
        assert prompt + max_tokens <= 64 and max_tokens == 16  # auto: a quarter of 64


@pytest.mark.slow(seconds=25)
async def test_thirty_turns_on_the_demo_model_stay_within_its_context(make_app):
    from kvdeck.assets import demo_model_dir

    # One plain paragraph per reply: 30 Markdown documents are what costs time here.
    reply = "json.dumps serialises obj to a JSON formatted string " * 4
    app, factory = make_app(token_delay=0.0, max_model_len=512, model_dir=demo_model_dir(),
                            real_tokenizer=True, reply=reply)
    async with app.run_test(size=(160, 48)) as pilot:
        # The fake loads the demo tokenizer: transformers' first import takes a while.
        assert await wait_for(pilot, lambda: app.engine_ready, timeout=60)
        chat = app.screen.chat
        for turn in range(30):
            chat.prompt_input.text = f"question {turn}: what does json.dumps do?"
            await pilot.press("enter")
            assert await wait_for(pilot, lambda t=turn: len(chat.transcript.turns) == 2 * t + 2
                                  and not chat.generating, timeout=10), f"turn {turn} wedged"
        sent = factory.client.sent
        assert len(sent) == 30 and all(p + m <= 512 for p, m in sent)
        assert all(m == 128 for _, m in sent)  # auto max_tokens: a quarter of the context
        # The early turns were left out of the later requests; the transcript kept them all.
        assert "question 0:" not in str(factory.client.last_messages)
        assert factory.client.last_messages[-1]["content"].startswith("question 29:")
        assert len(chat.transcript.turns) == 60
        assert "earlier messages left out" in replies(app)[-1].stats
        assert "question 0:" in app.transcript_store.load(chat.transcript.id).turns[0].content


async def test_settings_saved_in_the_dialog_are_there_after_a_restart(tmp_path):
    from kvdeck.tui.app import KvdeckApp
    from kvdeck.tui.settings_store import SettingsStore
    from tests.tui.conftest import FakeFactory

    path = tmp_path / "config" / "chat_settings.json"
    app = KvdeckApp(FakeFactory(), transcript_dir=tmp_path / "chats",
                    settings_store=SettingsStore(path))
    async with app.run_test(size=(100, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await pilot.press("ctrl+s")
        assert await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        app.screen.query_one("#temperature", Input).value = "0.3"
        app.screen.query_one("#max-tokens", Input).value = "77"
        app.screen.action_save()
        assert await wait_for(pilot, path.exists)
    again = KvdeckApp(FakeFactory(), transcript_dir=tmp_path / "chats",
                      settings_store=SettingsStore(path))
    assert (again.chat_settings.temperature, again.chat_settings.max_tokens) == (0.3, 77)
