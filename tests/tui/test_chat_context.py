"""Fitting a conversation into the context, and the chat settings on disk."""

from __future__ import annotations

import json

import pytest

from kvdeck.tui.chat_context import MessageTooLong, fit_to_context
from kvdeck.tui.chat_settings import MIN_REPLY_TOKENS, ChatSettings, auto_max_tokens
from kvdeck.tui.settings_store import SettingsStore
from kvdeck.tui.transcripts import ChatTurn


def words(messages: list[dict[str, str]]) -> int:
    """A tokenizer stand-in: one token per word plus two per message (role markers)."""
    return sum(len(m["content"].split()) + 2 for m in messages)


def history(pairs: int) -> list[ChatTurn]:
    turns = []
    for i in range(pairs):
        turns += [ChatTurn("user", f"question {i} " + "w " * 8),
                  ChatTurn("assistant", f"answer {i} " + "w " * 18)]
    return turns


def test_everything_is_sent_while_it_fits():
    fitted = fit_to_context(words, 512, "be brief", history(3), "next one", 64)
    assert fitted.dropped == 0 and fitted.max_tokens == 64
    assert [m["role"] for m in fitted.messages] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert fitted.prompt_tokens == words(fitted.messages)


def test_the_oldest_exchanges_are_left_out_first_and_just_enough():
    turns = history(30)  # 30 exchanges of 32 tokens: 960 tokens, far over the context
    fitted = fit_to_context(words, 512, "be brief", turns, "next one", 128)
    assert fitted.prompt_tokens + fitted.max_tokens <= 512
    assert fitted.max_tokens == 128
    kept = fitted.messages[1:-1]
    assert kept[0]["role"] == "user" and kept[-1]["content"] == turns[-1].content
    assert fitted.dropped == len(turns) - len(kept) and fitted.dropped % 2 == 0
    # One more exchange would not have fitted.
    one_more = [fitted.messages[0], *[{"role": t.role, "content": t.content}
                                      for t in turns[fitted.dropped - 2:]], fitted.messages[-1]]
    assert words(one_more) + 128 > 512


def test_a_long_message_shortens_the_reply_then_is_refused_with_its_token_count():
    fitted = fit_to_context(words, 512, "", history(2), "w " * 450, 128)
    assert fitted.dropped == 4 and fitted.max_tokens == 512 - 452
    with pytest.raises(MessageTooLong) as info:
        fit_to_context(words, 512, "", history(2), "w " * (512 - MIN_REPLY_TOKENS), 128)
    assert info.value.prompt_tokens == 512 - MIN_REPLY_TOKENS + 2
    assert f"{info.value.prompt_tokens} tokens" in str(info.value) and "512" in str(info.value)


def test_empty_turns_are_not_sent_and_the_budget_never_exceeds_the_context():
    turns = [ChatTurn("user", "hi"), ChatTurn("assistant", "")]
    fitted = fit_to_context(words, 64, "", turns, "again", 40)
    assert [m["content"] for m in fitted.messages] == ["hi", "again"]
    # A budget as large as the context: the history goes, the reply gets the rest.
    fitted = fit_to_context(words, 64, "", turns, "again", 1000)
    assert [m["content"] for m in fitted.messages] == ["again"]
    assert fitted.max_tokens + fitted.prompt_tokens == 64


def test_auto_max_tokens_is_a_share_of_the_context():
    assert auto_max_tokens(512) == 128 and auto_max_tokens(32768) == 1024
    assert ChatSettings().reply_budget(512) == 128
    assert ChatSettings(max_tokens=50).reply_budget(512) == 50


def test_settings_store_round_trip_atomic_and_forgiving(tmp_path):
    path = tmp_path / "config" / "chat_settings.json"
    store = SettingsStore(path)
    assert store.current == ChatSettings() and store.problem is None
    store.save(ChatSettings(system_prompt="Answer like a pirate.", temperature=0.2, seed=7))
    assert not list(path.parent.glob(".*.tmp"))
    again = SettingsStore(path)
    assert again.current == ChatSettings(system_prompt="Answer like a pirate.", temperature=0.2,
                                         seed=7)
    assert json.loads(path.read_text())["chat"]["max_tokens"] is None
    path.write_text(json.dumps({"format": 1, "chat": {"temperature": -3}}))
    broken = SettingsStore(path)
    assert broken.current == ChatSettings() and "temperature" in broken.problem
    assert SettingsStore(None).current == ChatSettings()
