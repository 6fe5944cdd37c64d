"""A thinking model's <think> block in the chat: shown dimmed above the reply as it streams,
kept out of the reply's text and of what the next request sends back, saved with the
transcript and shown again when it is reopened."""

from __future__ import annotations

import pytest
from textual.widgets import Markdown, Select, Static

from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.screens.chat_settings import ChatSettingsScreen
from kvdeck.tui.screens.transcript_picker import TranscriptPickerScreen
from tests.tui.conftest import wait_for
from tests.tui.fake_engine import FakeTokenizer
from tests.tui.test_chat_pilot import replies, send

THOUGHT = "weighing it up"
ANSWER = "Yes, it is."


class ThinkingTokenizer(FakeTokenizer):
    """Qwen3's way: the template knows <think> (its enable_thinking switch) and the model
    opens the block itself."""

    chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
                     "{% if enable_thinking is false %}<think></think>{% endif %}")

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **_):
        return "<|user|>?<|assistant|>\n"


async def test_the_thinking_shows_above_the_reply_and_is_not_sent_back(make_app):
    app, factory = make_app(token_delay=0.0, reply=f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        factory.client.tokenizer = ThinkingTokenizer()
        chat = app.screen.chat
        await send(pilot, "is it?")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2 and not chat.generating)
        reply = replies(app)[0]
        assert reply.query_one(Markdown).source == ANSWER
        shown = reply.query_one(".thinking", Static)
        assert not shown.has_class("-empty") and str(shown.render()) == THOUGHT
        turn = chat.transcript.turns[1]
        assert (turn.content, turn.thinking) == (ANSWER, THOUGHT)
        await send(pilot, "and?")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 4)
        assert factory.client.last_messages[2]["content"] == ANSWER  # the answer alone goes back
        first_id = chat.transcript.id
        await pilot.press("ctrl+n")
        assert await wait_for(pilot, lambda: chat.transcript.id != first_id)
        await pilot.press("ctrl+o")
        assert await wait_for(pilot, lambda: isinstance(app.screen, TranscriptPickerScreen))
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: chat.transcript.id == first_id and len(replies(app)) == 2)
        assert replies(app)[0].thinking == THOUGHT
        assert not replies(app)[0].query_one(".thinking", Static).has_class("-empty")


async def test_a_model_without_think_in_its_template_shows_the_reply_as_written(make_app):
    app, factory = make_app(token_delay=0.0, reply=f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        chat = app.screen.chat
        await send(pilot, "is it?")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2 and not chat.generating)
        assert chat.transcript.turns[1].thinking == ""
        assert replies(app)[0].query_one(".thinking", Static).has_class("-empty")
        assert THOUGHT in chat.transcript.turns[1].content


async def test_thinking_can_be_switched_off_for_a_thinking_model_only(make_app):
    app, factory = make_app(token_delay=0.0, reply=ANSWER)
    async with app.run_test(size=(100, 40)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        await pilot.press("ctrl+s")  # a model that does not think: nothing to switch
        assert await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        assert not app.screen.query("#thinking")
        await pilot.press("escape")
        factory.client.tokenizer = ThinkingTokenizer()
        await pilot.press("ctrl+s")
        assert await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
        modal = app.screen
        assert modal.query_one("#thinking", Select).value is True
        modal.query_one("#thinking", Select).value = False
        modal.action_save()
        assert await wait_for(pilot, lambda: app.chat_settings.thinking is False)
        chat = app.screen.chat
        await send(pilot, "quick")
        assert await wait_for(pilot, lambda: len(chat.transcript.turns) == 2 and not chat.generating)
        assert factory.client.last_template_kwargs == {"enable_thinking": False}
    saved = ChatSettings.from_json(app.chat_settings.to_json())
    assert saved.thinking is False and saved.template_kwargs() == {"enable_thinking": False}


def test_a_hand_edited_thinking_setting_is_checked():
    with pytest.raises(ValueError, match="thinking must be true or false, got 'no'"):
        ChatSettings.from_json({"thinking": "no"})
    assert ChatSettings.from_json({}).thinking is True  # settings saved before it existed
