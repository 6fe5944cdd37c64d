"""Ollama's API beside OpenAI's: /api/chat and /api/generate on the same engine, with the
same admission, limits, metrics and drain as the OpenAI routes (admission.py, streaming.py),
streamed as NDJSON (one JSON object a line, the last with `done` and the statistics) or
whole; plus the model's description (/api/tags, /api/show, /api/ps), /api/version,
Ollama's `GET /` probe and its model-management routes (ollama_management.py). Errors have
Ollama's shape (errors.py, by path). These routes are not in the OpenAPI document: Ollama's
own API docs describe them.
"""

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from kvdeck.app.serve.admission import Fields, ServeState, check_engine, submit
from kvdeck.app.serve.embeddings import ollama_embed
from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.ollama_management import install_model_management_routes
from kvdeck.app.serve.ollama_models import ModelCard, check_ollama_model, model_card, tagged_name
from kvdeck.app.serve.ollama_protocol import (
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaRequest,
    OllamaShowRequest,
    format_spec,
    parse_body,
    refuse_unsupported,
)
from kvdeck.app.serve.ollama_replies import (
    NDJSON,
    OllamaCallReader,
    created_at,
    final_fields,
    ndjson,
)
from kvdeck.app.serve.response_parts import chat_logprobs
from kvdeck.app.serve.streaming import EventStreamResponse, merged_outputs, run_to_end, stream_error
from kvdeck.app.serve.structured import plan_tool_use
from kvdeck.engine.api.async_llm import RequestStream
from kvdeck.engine.frontend.reasoning import ReasoningFormat, ReasoningStream, split_reasoning
from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.outputs import RequestOutput

OLLAMA_API_VERSION = "0.6.4"  # the Ollama release whose API this follows (clients gate on it)
KEEP_LOADED_UNTIL = "2318-01-01T00:00:00Z"  # /api/ps: loaded while the server runs


def install_ollama_routes(app: FastAPI, state: ServeState) -> None:
    cards: dict[Path, ModelCard] = {}

    @app.get("/", include_in_schema=False)
    @app.head("/", include_in_schema=False)
    async def root() -> PlainTextResponse:
        return PlainTextResponse("Ollama is running")  # the text Ollama's probes look for

    @app.get("/api/version", include_in_schema=False)
    async def api_version() -> JSONResponse:
        return JSONResponse({"version": OLLAMA_API_VERSION, "kvdeck": _kvdeck_version()})

    @app.get("/api/tags", include_in_schema=False)
    async def tags() -> JSONResponse:
        card = model_card(state, cards)
        return JSONResponse({"models": [card.listing(), *adapter_listings(state, card)]})

    @app.get("/api/ps", include_in_schema=False)
    async def running() -> JSONResponse:
        info = state.engine.info
        if state.engine.health().status != "ready" or info is None:
            return JSONResponse({"models": []})
        card = model_card(state, cards)
        size = card.size + info.num_blocks * info.kv_bytes_per_block
        return JSONResponse({"models": [{
            **card.listing(), "expires_at": KEEP_LOADED_UNTIL,
            "size": size, "size_vram": size if info.device.startswith("cuda") else 0,
            "context_length": info.max_model_len}]})

    @app.post("/api/show", include_in_schema=False)
    async def show(raw: Request) -> JSONResponse:
        req = await parse_body(raw, OllamaShowRequest)
        if not req.model:
            raise OpenAIError(400, "model is required", param="model")
        lora = check_ollama_model(state, req.model)
        card = model_card(state, cards)
        adapter = f"ADAPTER {lora.lora_path}\n" if lora is not None else ""  # Modelfile's word
        template = getattr(state.engine.tokenizer, "chat_template", None) or ""
        return JSONResponse({
            "modelfile": f"# kvdeck serves {card.model_dir}\nFROM {card.model_dir}\n{adapter}",
            "parameters": card.parameters, "template": template, "details": card.details,
            "model_info": card.model_info,
            # Ollama's "thinking": think true separates its reasoning (--reasoning-parser)
            "capabilities": ["completion", "tools", *(["thinking"] if state.reasoning else [])],
            "modified_at": card.modified_at})

    @app.post("/api/chat", include_in_schema=False)
    async def chat(raw: Request):
        return await ollama_chat(state, await parse_body(raw, OllamaChatRequest), raw)

    @app.post("/api/generate", include_in_schema=False)
    async def generate(raw: Request):
        return await ollama_generate(state, await parse_body(raw, OllamaGenerateRequest), raw)

    @app.post("/api/embed", include_in_schema=False)
    async def embed(raw: Request) -> JSONResponse:
        return await ollama_embed(state, await parse_body(raw, OllamaEmbedRequest), raw, legacy=False)

    @app.post("/api/embeddings", include_in_schema=False)
    async def embeddings(raw: Request) -> JSONResponse:
        return await ollama_embed(state, await parse_body(raw, OllamaEmbedRequest), raw, legacy=True)

    install_model_management_routes(app, state)


async def ollama_chat(state: ServeState, req: OllamaChatRequest, raw: Request):
    started = time.time()
    lora = check_ollama_model(state, req.model)
    refuse_unsupported(req, any(m.images for m in req.messages))
    check_engine(state)
    if not req.messages:  # Ollama's "load the model" call: it is loaded
        return JSONResponse({"model": req.model, "created_at": created_at(),
                             "message": {"role": "assistant", "content": ""},
                             "done_reason": "load", "done": True})
    structured = format_spec(req.format)
    tools = [tool.model_dump(exclude_none=True) for tool in req.tools] if req.tools else None
    plan = plan_tool_use(tools, None, True, getattr(state.engine.tokenizer, "chat_template", None),
                         state.tool_call_parser, structured)
    field = "format" if structured is not None else None
    if plan.constraint is not None:  # the generic format's grammar (it holds `format` too)
        structured, field = plan.constraint, field if plan.holds_answer else "tools"
    messages = plan.messages([m.for_template(i) for i, m in enumerate(req.messages)])
    reasoning = _reasoning(state, req, structured)
    streams = await _submit(state, req, structured, Fields("messages", field),
                            messages=messages, tools=plan.template_tools, lora=lora)
    reader = OllamaCallReader(plan.call_format) if plan.call_format is not None else None
    if req.stream:
        return EventStreamResponse(_chat_lines(state, streams, req.model, started, reader,
                                               req.num_logprobs, reasoning), streams, media_type=NDJSON)
    ((out,),) = await run_to_end(streams, raw, state.drain)
    thought, answer = split_reasoning(reasoning, out.outputs[0].text, True)
    message: dict = {"role": "assistant", "content": answer}
    if thought:
        message["thinking"] = thought
    if reader is not None:
        message["content"], calls = reader.update(answer, True)
        if calls:
            message["tool_calls"] = calls
    return JSONResponse({"model": req.model, "created_at": created_at(), "message": message,
                         **_logprobs(out, 0, req.num_logprobs), **final_fields(out, started)})


async def ollama_generate(state: ServeState, req: OllamaGenerateRequest, raw: Request):
    started = time.time()
    lora = check_ollama_model(state, req.model)
    refuse_unsupported(req, bool(req.images))
    for name, given in (("suffix", req.suffix), ("template", req.template),
                        ("context", req.context)):
        if given:
            raise OpenAIError(400, f"{name} is not supported: kvdeck renders prompts with the "
                                   "model's own chat template and keeps no context between "
                                   "requests (send the conversation to /api/chat)", param=name)
    check_engine(state)
    if not req.prompt:  # Ollama's "load the model" call: it is loaded
        return JSONResponse({"model": req.model, "created_at": created_at(), "response": "",
                             "done_reason": "load", "done": True})
    structured = format_spec(req.format)
    field = "format" if structured is not None else None
    reasoning = _reasoning(state, req, structured)
    if req.raw:  # the prompt as written, no template (Ollama ignores `system` then too)
        streams = await _submit(state, req, structured, Fields("prompt", field), prompt=req.prompt,
                                lora=lora)
    else:
        messages = ([{"role": "system", "content": req.system}] if req.system else []) + \
            [{"role": "user", "content": req.prompt}]
        streams = await _submit(state, req, structured, Fields("prompt", field), messages=messages,
                                lora=lora)
    if req.stream:
        return EventStreamResponse(_generate_lines(state, streams, req.model, started, req.num_logprobs,
                                                   reasoning), streams, media_type=NDJSON)
    ((out,),) = await run_to_end(streams, raw, state.drain)
    thought, answer = split_reasoning(reasoning, out.outputs[0].text, True)
    return JSONResponse({"model": req.model, "created_at": created_at(), "response": answer,
                         **({"thinking": thought} if thought else {}),
                         **_logprobs(out, 0, req.num_logprobs), **final_fields(out, started)})


async def _submit(state: ServeState, req: OllamaRequest, structured, fields: Fields,
                  prompt: str | None = None, messages: list[dict] | None = None,
                  tools: list[dict] | None = None,
                  lora: LoRARequest | None = None) -> list[RequestStream]:
    params = req.options.sampling_params(structured, req.num_logprobs)
    state.metrics.observe_request_params(1, params.max_tokens)
    # think: the chat template's enable_thinking (Qwen3's switch; other templates ignore it)
    template_kwargs = {"enable_thinking": req.thinks} if req.thinks is not None and messages else None
    # Ollama runs num_predict to the context's end instead of refusing: never a 400 for it.
    return await submit(state, [(f"ollama-{uuid.uuid4().hex}", prompt)], params, fields,
                        messages=messages, tools=tools, lora_request=lora,
                        chat_template_kwargs=template_kwargs)


def _reasoning(state: ServeState, req: OllamaRequest, structured) -> ReasoningFormat | None:
    """How the reply's thinking is told apart (Ollama's `thinking`): the server's
    --reasoning-parser, unless think is false or a grammar holds the reply from its start.
    think true on a server without one is a 400: its thinking could not be separated."""
    if req.thinks and state.reasoning is None:
        raise OpenAIError(400, "think needs a thinking model served with --reasoning-parser "
                               "(qwen3 or deepseek_r1): without it the thinking cannot be told "
                               "apart from the answer", param="think")
    if req.thinks is False or structured is not None:
        return None
    return state.reasoning


def adapter_listings(state: ServeState, base: ModelCard) -> list[dict]:
    """/api/tags' entries for the LoRA adapters: the base's card under the adapter's name,
    the base as `details.parent_model` (as Ollama lists a model made with ADAPTER)."""
    if state.adapters is None:
        return []
    listing = base.listing()
    return [{**listing, "name": tagged_name(a.name), "model": tagged_name(a.name),
             "details": {**listing["details"], "parent_model": base.name}}
            for a in state.adapters.served()]


def _logprobs(out: RequestOutput, start: int, num: int | None) -> dict:
    """Ollama's `logprobs` field (OpenAI chat's entries: token, logprob, bytes, top_logprobs)
    for the tokens from `start` on; nothing when none were asked for."""
    return {} if num is None else {"logprobs": chat_logprobs(out, start, num)["content"]}


async def _chat_lines(state: ServeState, streams: list[RequestStream], model: str, started: float,
                      reader: OllamaCallReader | None, logprobs: int | None = None,
                      reasoning: ReasoningFormat | None = None) -> AsyncIterator[str]:
    sent = 0  # tokens whose logprobs went out (a line carries those of the tokens since)
    reasoner = ReasoningStream(reasoning)
    try:
        async with aclosing(merged_outputs(streams, state.drain)) as outputs:
            async for _, out in outputs:
                completion = out.outputs[0]
                done = completion.finish_reason is not None
                thought, new_text, answer = reasoner.update(completion.text, done)
                content, calls = (reader.update(answer, done) if reader is not None
                                  else (new_text, []))
                if content or calls or thought:
                    message: dict = {"role": "assistant", "content": content}
                    if thought:
                        message["thinking"] = thought
                    if calls:
                        message["tool_calls"] = calls
                    yield ndjson({"model": model, "created_at": created_at(), "message": message,
                                  **_logprobs(out, sent, logprobs), "done": False})
                    sent = len(completion.token_ids)
                if done:
                    yield ndjson({"model": model, "created_at": created_at(),
                                  "message": {"role": "assistant", "content": ""},
                                  **_logprobs(out, sent, logprobs), **final_fields(out, started)})
    except Exception as exc:  # the client raises on an object with "error"
        yield ndjson({"error": stream_error(exc).message})


async def _generate_lines(state: ServeState, streams: list[RequestStream], model: str,
                          started: float, logprobs: int | None = None,
                          reasoning: ReasoningFormat | None = None) -> AsyncIterator[str]:
    sent = 0  # as _chat_lines
    reasoner = ReasoningStream(reasoning)
    try:
        async with aclosing(merged_outputs(streams, state.drain)) as outputs:
            async for _, out in outputs:
                done = out.outputs[0].finish_reason is not None
                thought, new_text, _ = reasoner.update(out.outputs[0].text, done)
                if new_text or thought:
                    yield ndjson({"model": model, "created_at": created_at(), "response": new_text,
                                  **({"thinking": thought} if thought else {}),
                                  **_logprobs(out, sent, logprobs), "done": False})
                    sent = len(out.outputs[0].token_ids)
                if out.outputs[0].finish_reason is not None:
                    yield ndjson({"model": model, "created_at": created_at(), "response": "",
                                  **_logprobs(out, sent, logprobs), **final_fields(out, started)})
    except Exception as exc:  # the client raises on an object with "error"
        yield ndjson({"error": stream_error(exc).message})


def _kvdeck_version() -> str:
    try:
        return version("kvdeck")
    except PackageNotFoundError:
        return "unknown"
