"""The bodies of Ollama's replies: the final object's timings and counts (nanoseconds, as
Ollama gives them), tool calls as Ollama shapes them, and NDJSON lines.

Timings come from the engine's own timestamps: `prompt_eval_duration` from when the request
was first scheduled to its first token, `eval_duration` the time per token after that
times the tokens generated (so eval_count / eval_duration is the decode rate); the model
is loaded when the server starts, so `load_duration` is 0.
"""

import json
import logging
import time
from dataclasses import dataclass

from kvdeck.app.serve.structured import CallFormat, split_reply
from kvdeck.engine.frontend.tool_calls import ParsedCall
from kvdeck.engine.types.outputs import RequestOutput

logger = logging.getLogger("kvdeck.serve")
NS = 1_000_000_000


NDJSON = "application/x-ndjson"  # the media type of Ollama's streamed replies


def ndjson(body: dict) -> str:
    return json.dumps(body, ensure_ascii=False) + "\n"


def created_at() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % NS:09d}Z"


def final_fields(out: RequestOutput, started: float, done_reason: str | None = None) -> dict:
    """`done` and the statistics of the last object; `started`: time.time() when the HTTP
    request arrived."""
    metrics = out.metrics
    completion = out.outputs[0]
    generated = len(completion.token_ids)
    first = metrics.first_token_time
    scheduled = metrics.first_scheduled_time or metrics.arrival_time
    prompt_s = (first - scheduled) if first is not None else 0.0
    last = metrics.last_token_time or first
    if generated > 1 and first is not None and last is not None:
        eval_s = (last - first) * generated / (generated - 1)
    else:
        eval_s = prompt_s  # one token: it came out of the prompt's step
    end = metrics.finished_time or last or time.time()
    return {"done": True, "done_reason": done_reason or completion.finish_reason,
            "total_duration": _ns(end - started), "load_duration": 0,
            "prompt_eval_count": len(out.prompt_token_ids),
            "prompt_eval_duration": _ns(prompt_s), "eval_count": generated,
            "eval_duration": max(1, _ns(eval_s)) if generated else 0}


def _ns(seconds: float) -> int:
    return max(0, round(seconds * NS))


@dataclass(slots=True)
class OllamaCallReader:
    """A reply's text to Ollama's content and `tool_calls`, as it grows: each call goes out
    once it is complete, whole, with its arguments as a JSON object."""

    fmt: CallFormat
    content_sent: int = 0
    calls_sent: int = 0

    def update(self, text: str, final: bool) -> tuple[str, list[dict]]:
        parsed = split_reply(self.fmt, text, final)
        content = parsed.content[self.content_sent:]
        self.content_sent = len(parsed.content)
        complete = [call for call in parsed.calls if call.complete]
        new = complete[self.calls_sent:]
        self.calls_sent = len(complete)
        return content, [shaped for call in new if (shaped := _ollama_call(call)) is not None]


def _ollama_call(call: ParsedCall) -> dict | None:
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):  # Ollama's clients take only an object
        logger.warning("dropped a call to %s: its arguments are not a JSON object: %.200s",
                       call.name, call.arguments)
        return None
    return {"function": {"name": call.name, "arguments": arguments}}
