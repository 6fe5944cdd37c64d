"""A streamed response (/v1/responses with stream: true): OpenAI's typed Server-Sent Events,
numbered. response.created, then each output item added, its deltas and its done events
(reasoning text, output text, function call arguments), then response.completed, or
response.incomplete when max_output_tokens ended it, or response.failed when the engine
could not finish it. The events of one item are in the order OpenAI's client accumulates
them: an item is added before its parts, its parts before their deltas."""

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from kvdeck.app.serve.admission import ServeState
from kvdeck.app.serve.openai_routes import ChatRun
from kvdeck.app.serve.reply_deltas import reply_deltas
from kvdeck.app.serve.response_parts import chat_logprobs
from kvdeck.app.serve.responses_output import (
    ResponseHeader,
    count_tokens,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    status_of,
    text_part,
    tool_namespaces,
    usage,
)
from kvdeck.app.serve.streaming import stream_error
from kvdeck.engine.types.outputs import RequestOutput


@dataclass(slots=True)
class _OpenItem:
    """An output item still growing: its place in `output`, its kind and text so far."""

    index: int
    kind: str  # "reasoning", "message" or "function_call"
    id: str
    text: str = ""  # reasoning or output text, or a call's arguments
    call_id: str = ""
    name: str = ""
    logprobs: list[dict] | None = None  # the message's, when asked


@dataclass(slots=True)
class OutputEvents:
    """The events for one response's output. A message or reasoning item stays open until
    another item starts; calls stay open to the end (their arguments may still grow)."""

    with_logprobs: bool
    sequence: int = 0
    output: list[dict] = field(default_factory=list)  # each item's latest body, by index
    text_item: _OpenItem | None = None
    calls: dict[int, _OpenItem] = field(default_factory=dict)  # by the call's index in the reply
    status: str = "completed"  # what items closed at the end say
    pending_logprobs: list[dict] = field(default_factory=list)  # of text held back so far
    namespaces: dict[str, str] = field(default_factory=dict)  # responses_output.tool_namespaces

    def event(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    def _add(self, item: _OpenItem, body: dict) -> list[str]:
        self.output.append(body)
        return [self.event("response.output_item.added", output_index=item.index, item=body)]

    def _text(self, kind: str, delta: str, logprobs: list[dict] | None) -> list[str]:
        events = []
        if self.text_item is None or self.text_item.kind != kind:
            events += self._close_text()
            item = _OpenItem(len(self.output), kind, new_id("msg" if kind == "message" else "rs"))
            item.logprobs = [] if kind == "message" and self.with_logprobs else None
            self.text_item = item
            if kind == "message":
                events += self._add(item, message_item(item.id, [], "in_progress"))
                part = text_part("", [] if item.logprobs is not None else None)
            else:
                events += self._add(item, reasoning_item(item.id, "", "in_progress"))
                part = {"type": "reasoning_text", "text": ""}
            events.append(self.event("response.content_part.added", item_id=item.id,
                                     output_index=item.index, content_index=0, part=part))
        item = self.text_item
        item.text += delta
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if kind == "reasoning":
            events.append(self.event("response.reasoning_text.delta", **where, delta=delta))
        else:
            if item.logprobs is not None:
                item.logprobs += logprobs or []
            events.append(self.event("response.output_text.delta", **where, delta=delta,
                                     logprobs=logprobs or []))
        return events

    def reasoning(self, delta: str) -> list[str]:
        return self._text("reasoning", delta, None) if delta else []

    def text(self, delta: str, logprobs: list[dict] | None) -> list[str]:
        """`logprobs`: the new tokens'; those of text held back go with the next delta."""
        self.pending_logprobs += logprobs or []
        if not delta:
            return []
        logprobs, self.pending_logprobs = self.pending_logprobs, []
        return self._text("message", delta, logprobs)

    def call_deltas(self, deltas: list[dict]) -> list[str]:
        """ToolCallStream's deltas: a call's start (id and name), then its arguments."""
        events = []
        for delta in deltas:
            function = delta["function"]
            if "id" in delta:
                events += self._close_text()
                item = _OpenItem(len(self.output), "function_call", new_id("fc"),
                                 call_id=delta["id"], name=function["name"])
                self.calls[delta["index"]] = item
                events += self._add(item, function_call_item(item.id, item.call_id, item.name, "",
                                                             "in_progress",
                                                             self.namespaces.get(item.name)))
            item = self.calls[delta["index"]]
            if function.get("arguments"):
                item.text += function["arguments"]
                events.append(self.event("response.function_call_arguments.delta",
                                         item_id=item.id, output_index=item.index,
                                         delta=function["arguments"]))
        return events

    def _close_text(self) -> list[str]:
        item, self.text_item = self.text_item, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "reasoning":
            body = reasoning_item(item.id, item.text, self.status)
            events = [self.event("response.reasoning_text.done", **where, text=item.text),
                      self.event("response.content_part.done", **where, part=body["content"][0])]
        else:
            if item.logprobs is not None:  # tokens after the last text (a stop string's)
                item.logprobs += self.pending_logprobs
            part = text_part(item.text, item.logprobs)
            body = message_item(item.id, [part], self.status)
            events = [self.event("response.output_text.done", **where, text=item.text,
                                 logprobs=item.logprobs or []),
                      self.event("response.content_part.done", **where, part=part)]
        self.output[item.index] = body
        return events + [self.event("response.output_item.done", output_index=item.index,
                                    item=body)]

    def close(self, status: str) -> list[str]:
        """Every open item done, in output order."""
        self.status = status
        events = self._close_text()
        for item in sorted(self.calls.values(), key=lambda call: call.index):
            body = function_call_item(item.id, item.call_id, item.name, item.text, self.status,
                                      self.namespaces.get(item.name))
            self.output[item.index] = body
            events += [self.event("response.function_call_arguments.done", item_id=item.id,
                                  output_index=item.index, name=item.name, arguments=item.text),
                       self.event("response.output_item.done", output_index=item.index, item=body)]
        self.calls = {}
        return events


async def response_events(state: ServeState, header: ResponseHeader, run: ChatRun,
                          on_end: Callable[[dict], None]) -> AsyncIterator[str]:
    """The whole event stream of one response; `on_end` gets the final response object of
    one that completed or ended incomplete (the route keeps it)."""
    events = OutputEvents(with_logprobs=run.logprobs is not None,
                          namespaces=tool_namespaces(header.request))
    yield events.event("response.created", response=header.body("in_progress", []))
    yield events.event("response.in_progress", response=header.body("in_progress", []))
    sent_tokens, thought = 0, ""
    final: RequestOutput | None = None
    try:
        async with aclosing(reply_deltas(state, run, header.request.parallel_tool_calls)) as deltas:
            async for delta in deltas:
                final = delta.out
                new_logprobs = chat_logprobs(delta.out, sent_tokens, run.logprobs)
                sent_tokens = len(delta.out.outputs[0].token_ids)
                thought += delta.thought
                for event in (events.reasoning(delta.thought)
                              + events.text(delta.text, new_logprobs["content"] if new_logprobs else None)
                              + events.call_deltas(delta.calls)):
                    yield event
        status, reason = status_of(final)
        for event in events.close(status):
            yield event
        used = usage(final, count_tokens(state.engine.tokenizer, thought))
        body = header.body(status, events.output, used, incomplete_reason=reason)
        on_end(body)
        yield events.event(f"response.{status}", response=body)
    except Exception as exc:  # the stream ends with response.failed, never cut
        error = stream_error(exc)
        yield events.event("response.failed", response=header.body(
            "failed", events.output, error={"code": error.code or "server_error",
                                            "message": error.message}))
