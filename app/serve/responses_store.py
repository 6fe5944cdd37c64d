"""The Responses API's stored responses (`store`, OpenAI's default): the last STORED_RESPONSES
kept in memory until the server stops, so a request may continue one
(`previous_response_id`), and a client may fetch, list the input of, or delete one. Each
keeps only its own turn (its input and its reply, as chat messages) and a link to the one it
continued; a conversation is the chain of links, so memory grows with the conversation, not
with its square. `instructions` are not carried over, as OpenAI does not."""

from collections import OrderedDict
from dataclasses import dataclass

STORED_RESPONSES = 1024


@dataclass(slots=True)
class StoredResponse:
    body: dict  # the response object as the client got it
    messages: list[dict]  # this turn as chat messages: its input, then its reply
    input_items: list[dict]  # its input as the request gave it (for input_items)
    previous: str | None  # the response it continued


class UnknownResponse(KeyError):
    """A response id that is not kept (never stored, deleted, or evicted)."""


class ResponseStore:
    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response: StoredResponse) -> None:
        self._kept[response.body["id"]] = response
        self._kept.move_to_end(response.body["id"])
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse:
        try:
            response = self._kept[response_id]
        except KeyError:
            raise UnknownResponse(response_id) from None
        self._kept.move_to_end(response_id)  # a conversation in use stays
        return response

    def delete(self, response_id: str) -> None:
        if self._kept.pop(response_id, None) is None:
            raise UnknownResponse(response_id)

    def conversation(self, response_id: str) -> list[dict]:
        """The chat messages of every turn up to and including `response_id`'s. Its turns
        become the most recently used, the latest last (the first to go is the oldest)."""
        chain: list[str] = []
        next_id: str | None = response_id
        while next_id is not None:
            chain.append(next_id)
            next_id = self.get(next_id).previous
        chain.reverse()
        for kept in chain:
            self._kept.move_to_end(kept)
        return [message for kept in chain for message in self._kept[kept].messages]


def reply_messages(output: list[dict]) -> list[dict]:
    """A response's output items as the assistant's chat message (text and calls; its
    reasoning is left out, as templates leave earlier thinking out)."""
    text = "".join(part["text"] for item in output if item["type"] == "message"
                   for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    message: dict = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return [message]
