"""The Responses API's output: the response object and its items (reasoning, a message of
output_text, function calls), as OpenAI's clients read them. Used whole by a reply and piece
by piece by a stream (responses_stream.py)."""

import time
import uuid
from dataclasses import dataclass, field

from kvdeck.app.serve.responses_protocol import ResponsesRequest
from kvdeck.engine.types.outputs import RequestOutput


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def text_part(text: str, logprobs: list[dict] | None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def message_item(item_id: str, parts: list[dict], status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": parts}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str = "completed", namespace: str | None = None) -> dict:
    """`namespace`: the namespace tool the function came in, named as OpenAI's calls name it."""
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}
    if namespace is not None:
        item["namespace"] = namespace
    return item


def tool_namespaces(request: ResponsesRequest) -> dict[str, str]:
    """The functions that came in a namespace tool, by name."""
    return {tool.name: tool.namespace for tool in request.tools or [] if tool.namespace}


def usage(out: RequestOutput, reasoning_tokens: int) -> dict:
    prompt, generated = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": out.num_cached_tokens},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, generated)},
            "total_tokens": prompt + generated}


def count_tokens(tokenizer, text: str) -> int:
    """The tokens of a reply's reasoning (usage's reasoning_tokens): its text encoded again,
    which gives back the tokens it was decoded from."""
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


@dataclass(slots=True)
class ResponseHeader:
    """What every copy of one response object says (created, streamed, completed)."""

    request: ResponsesRequest
    model_name: str
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict], usage: dict | None = None,
             error: dict | None = None, incomplete_reason: str | None = None) -> dict:
        req = self.request
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        tool_choice = req.tool_choice.model_dump() if req.tool_choice is not None and \
            not isinstance(req.tool_choice, str) else (req.tool_choice or "auto")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.model_name, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning.model_dump() if req.reasoning is not None else None,
            "store": req.store,
            "temperature": req.temperature, "top_p": req.top_p, "top_logprobs": req.top_logprobs,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt is not None else {"type": "text"}},
            "tool_choice": tool_choice,
            "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or []],
            "truncation": req.truncation, "usage": usage, "user": req.user,
            "metadata": req.metadata or {},
        }


def status_of(out: RequestOutput) -> tuple[str, str | None]:
    """"completed", or "incomplete" with OpenAI's reason when max_output_tokens (or the
    context) ended the reply."""
    if out.outputs[0].finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None
