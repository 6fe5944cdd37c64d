"""One chat reply as it grows, in the pieces the Responses and Messages APIs stream: per
engine output, the reasoning's new text, the answer's new text (calls taken out) and the
tool-call deltas (ToolCallStream's: a call's start, then its arguments). Outputs that add
no text (a partial character, a possible stop string held back) are skipped until text or
the end comes."""

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from kvdeck.app.serve.admission import ServeState
from kvdeck.app.serve.openai_routes import ChatRun
from kvdeck.app.serve.streaming import merged_outputs
from kvdeck.app.serve.structured import ToolCallStream
from kvdeck.engine.frontend.reasoning import ReasoningStream
from kvdeck.engine.types.outputs import RequestOutput


@dataclass(slots=True)
class ReplyDelta:
    out: RequestOutput  # the engine's output it came from
    thought: str  # the reasoning's new text
    text: str  # the answer's new text
    calls: list[dict]  # new tool-call deltas
    done: bool  # the reply's last
    called: bool  # it has called a tool so far


async def reply_deltas(state: ServeState, run: ChatRun, parallel: bool) -> AsyncIterator[ReplyDelta]:
    """`parallel`: more than one call read from the reply."""
    reasoner = ReasoningStream(run.reasoning)
    calls = (ToolCallStream(run.tools.call_format, parallel)
             if run.tools.call_format is not None else None)
    async with aclosing(merged_outputs(run.streams, state.drain)) as outputs:
        async for _, out in outputs:
            done = out.outputs[0].finish_reason is not None
            if not done and not out.delta_text:
                continue
            thought, text, answer = reasoner.update(out.outputs[0].text, done)
            deltas: list[dict] = []
            if calls is not None:
                text, deltas = calls.update(answer, done)
            yield ReplyDelta(out, thought, text, deltas, done, calls is not None and calls.called)
