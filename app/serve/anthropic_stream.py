"""A streamed message (/v1/messages with stream: true) as Anthropic's Server-Sent Events:
message_start, then each content block's start, deltas (thinking_delta, text_delta,
input_json_delta) and stop, one block at a time, then message_delta (the stop reason and
usage) and message_stop; an `error` event when the engine cannot finish. Also the stop
reason and usage a whole reply carries."""

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from kvdeck.app.serve.admission import ServeState
from kvdeck.app.serve.errors import anthropic_error_body
from kvdeck.app.serve.openai_routes import ChatRun
from kvdeck.app.serve.reply_deltas import ReplyDelta, reply_deltas
from kvdeck.app.serve.streaming import stream_error
from kvdeck.engine.types.outputs import RequestOutput


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def usage(out: RequestOutput) -> dict:
    """Anthropic counts the prompt's tokens read from the cache apart from `input_tokens`."""
    cached = out.num_cached_tokens
    return {"input_tokens": len(out.prompt_token_ids) - cached,
            "output_tokens": len(out.outputs[0].token_ids),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def stop_fields(out: RequestOutput, called: bool) -> dict:
    """stop_reason: tool_use, max_tokens, stop_sequence (with the one met) or end_turn."""
    completion = out.outputs[0]
    reason, sequence = "end_turn", None
    if called:
        reason = "tool_use"
    elif completion.finish_reason == "length":
        reason = "max_tokens"
    elif isinstance(completion.stop_reason, str):
        reason, sequence = "stop_sequence", completion.stop_reason
    return {"stop_reason": reason, "stop_sequence": sequence}


@dataclass(slots=True)
class BlockEvents:
    """The content blocks' events; one block is open at a time, as Anthropic streams them."""

    index: int = -1  # the latest block's
    kind: str | None = None  # the open block's: "thinking", "text" or "tool_use" (None: none)
    call: int | None = None  # the open tool_use block's call, by its index in the reply

    def event(self, kind: str, **fields) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    def _start(self, kind: str, block: dict) -> list[str]:
        events = self.stop()
        self.index, self.kind = self.index + 1, kind
        return events + [self.event("content_block_start", index=self.index, content_block=block)]

    def stop(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [self.event("content_block_stop", index=self.index)]

    def _delta(self, delta: dict) -> str:
        return self.event("content_block_delta", index=self.index, delta=delta)

    def thinking(self, delta: str) -> list[str]:
        if not delta:
            return []
        events = [] if self.kind == "thinking" else \
            self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return events + [self._delta({"type": "thinking_delta", "thinking": delta})]

    def text(self, delta: str) -> list[str]:
        if not delta:
            return []
        events = [] if self.kind == "text" else self._start("text", {"type": "text", "text": ""})
        return events + [self._delta({"type": "text_delta", "text": delta})]

    def calls(self, deltas: list[dict]) -> list[str]:
        """ToolCallStream's deltas: a call's start (its name), then its arguments' JSON."""
        events = []
        for delta in deltas:
            function = delta["function"]
            if "id" in delta:
                events += self._start("tool_use", {"type": "tool_use", "id": new_tool_use_id(),
                                                   "name": function["name"], "input": {}})
                self.call = delta["index"]
            if function.get("arguments") and self.kind == "tool_use" and delta["index"] == self.call:
                events.append(self._delta({"type": "input_json_delta",
                                           "partial_json": function["arguments"]}))
        return events


async def message_events(state: ServeState, run: ChatRun, message_id: str,
                         parallel: bool) -> AsyncIterator[str]:
    """The whole event stream of one message."""
    blocks = BlockEvents()
    yield blocks.event("message_start", message={
        "id": message_id, "type": "message", "role": "assistant", "content": [],
        "model": run.model_name, "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": len(run.streams[0].prompt_token_ids), "output_tokens": 0}})
    final: ReplyDelta | None = None
    try:
        async with aclosing(reply_deltas(state, run, parallel)) as deltas:
            async for delta in deltas:
                final = delta
                for event in (blocks.thinking(delta.thought) + blocks.text(delta.text)
                              + blocks.calls(delta.calls)):
                    yield event
        for event in blocks.stop():
            yield event
        yield blocks.event("message_delta", delta=stop_fields(final.out, final.called),
                           usage=usage(final.out))
        yield blocks.event("message_stop")
    except Exception as exc:  # the stream ends with an error event, never cut
        error = stream_error(exc)
        yield blocks.event("error", error=anthropic_error_body(error.status, error.message)["error"])
