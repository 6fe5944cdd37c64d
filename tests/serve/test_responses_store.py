"""The Responses API's store: a conversation is its chain of kept turns; the least recently
used go first, and a chain with a turn gone is refused, never rebuilt with a hole."""

import pytest

from kvdeck.app.serve.responses_store import (
    ResponseStore,
    StoredResponse,
    UnknownResponse,
    reply_messages,
)


def turn(response_id: str, previous: str | None, text: str) -> StoredResponse:
    return StoredResponse({"id": response_id}, [{"role": "user", "content": text}], [], previous)


def test_a_conversation_is_its_chain_and_the_least_recently_used_go_first():
    store = ResponseStore(capacity=3)
    store.put(turn("a", None, "1"))
    store.put(turn("b", "a", "2"))
    store.put(turn("c", "b", "3"))
    assert [m["content"] for m in store.conversation("c")] == ["1", "2", "3"]  # uses a, b, c
    store.put(turn("x", None, "other"))  # a was used longest ago
    with pytest.raises(UnknownResponse):
        store.get("a")
    with pytest.raises(UnknownResponse):
        store.conversation("c")  # its first turn is gone: refused, not rebuilt with a hole
    store.delete("x")
    with pytest.raises(UnknownResponse):
        store.delete("x")


def test_the_reply_as_the_assistants_message():
    output = [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
              {"type": "message", "content": [{"type": "output_text", "text": "Let me look."}]},
              {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}]
    assert reply_messages(output) == [{"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    assert reply_messages(output[2:])[0]["content"] is None
    assert reply_messages([])[0]["content"] == ""
