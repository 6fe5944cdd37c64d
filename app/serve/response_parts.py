"""Pieces of OpenAI response bodies: prompt lists, usage, SSE events and logprobs."""

import json

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



def completion_logprobs(out: RequestOutput, start: int, num: int | None) -> dict | None:
    if num is None:
        return None
    offset = len(out.outputs[0].text) - len(out.delta_text) if start else 0
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entry in _new_logprobs(out, start):
        sampled = entry[token_id]
        text = sampled.decoded or ""
        tokens.append(text)
        token_logprobs.append(sampled.logprob)
        top = {lp.decoded or "": lp.logprob for lp in _top(entry, num)}
        top.setdefault(text, sampled.logprob)
        top_logprobs.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}



def chat_logprobs(out: RequestOutput, start: int, num: int | None) -> dict | None:
    if num is None:
        return None

    def item(lp: Logprob) -> dict:
        text = lp.decoded or ""
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = [{**item(entry[token_id]), "top_logprobs": [item(lp) for lp in _top(entry, num)]}
               for token_id, entry in _new_logprobs(out, start)]
    return {"content": content}
