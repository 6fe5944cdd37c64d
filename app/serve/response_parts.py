"""Pieces of OpenAI response bodies: prompt lists, usage, SSE events and logprobs."""

import json
from collections.abc import Callable

from kvdeck.app.serve.errors import OpenAIError
from kvdeck.engine.types.outputs import Logprob, RequestOutput


def prompt_list(prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise OpenAIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    return list(prompt)



def usage(finals: list[RequestOutput | None], choices_per_prompt: int) -> dict:
    # A prompt counts once however many choices it has (OpenAI's usage).
    prompt = sum(len(o.prompt_token_ids) for o in finals[::choices_per_prompt] if o is not None)
    completion = sum(len(o.outputs[0].token_ids) for o in finals if o is not None)
    cached = sum(o.num_cached_tokens for o in finals if o is not None)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}}



def sse_event(body: dict) -> str:
    # ASCII-escaped: clients that split lines on U+2028 or NEL must not cut an event in two
    return f"data: {json.dumps(body)}\n\n"



def _new_logprobs(out: RequestOutput, start: int) -> list[tuple[int, dict[int, Logprob]]]:
    completion = out.outputs[0]
    end = len(completion.token_ids)  # the shared logprobs list may already be longer
    entries = (completion.logprobs or [])[start:end]
    return list(zip(completion.token_ids[start:end], entries, strict=False))



def _top(entry: dict[int, Logprob], num: int) -> list[Logprob]:
    return sorted(entry.values(), key=lambda lp: lp.logprob, reverse=True)[:num]



def completion_logprobs(out: RequestOutput, start: int, num: int | None,
                        offset: int = 0) -> dict | None:
    """The completion's tokens from `start` on, in /v1/completions' logprobs shape; `offset`:
    the characters before the completion's text in the choice (an echoed prompt's)."""
    if num is None:
        return None
    offset += len(out.outputs[0].text) - len(out.delta_text) if start else 0
    found: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, entry in _new_logprobs(out, start):
        offset = _add_token(found, entry[token_id].decoded or "", entry[token_id], entry, num, offset)
    return found


def echoed_logprobs(out: RequestOutput, num: int, decode: Callable[[list[int]], str]) -> dict:
    """echo with logprobs: the prompt's tokens (the first has no logprob: nothing predicts
    it, so null as OpenAI gives it), then the completion's."""
    entries = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
    found: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for token_id, entry in zip(out.prompt_token_ids, entries, strict=False):
        if entry is None:
            offset = _add_token(found, decode([token_id]), None, None, num, offset)
        else:
            offset = _add_token(found, entry[token_id].decoded or "", entry[token_id], entry, num, offset)
    completion = completion_logprobs(out, 0, num, offset)
    return {key: found[key] + completion[key] for key in found}


def _add_token(found: dict[str, list], text: str, chosen: Logprob | None,
               entry: dict[int, Logprob] | None, num: int, offset: int) -> int:
    found["tokens"].append(text)
    found["token_logprobs"].append(chosen.logprob if chosen is not None else None)
    if entry is None or chosen is None:
        found["top_logprobs"].append(None)
    else:
        top = {lp.decoded or "": lp.logprob for lp in _top(entry, num)}
        top.setdefault(text, chosen.logprob)
        found["top_logprobs"].append(top)
    found["text_offset"].append(offset)
    return offset + len(text)


def prompt_logprobs_body(out: RequestOutput) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token, null for the first, then
    {token id: {logprob, rank, decoded_token}} for the token and its top candidates."""
    if out.prompt_logprobs is None:
        return None
    return [None if entry is None else
            {str(token_id): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded}
             for token_id, lp in entry.items()}
            for entry in out.prompt_logprobs]



def chat_logprobs(out: RequestOutput, start: int, num: int | None) -> dict | None:
    if num is None:
        return None

    def item(lp: Logprob) -> dict:
        text = lp.decoded or ""
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = [{**item(entry[token_id]), "top_logprobs": [item(lp) for lp in _top(entry, num)]}
               for token_id, entry in _new_logprobs(out, start)]
    return {"content": content}
