"""Embeddings: OpenAI's /v1/embeddings and Ollama's /api/embed and /api/embeddings.

An input's embedding is the model's final hidden state at its last token, L2-normalised
(SamplingParams.embed: last-token pooling, how decoder embedding models such as
Qwen3-Embedding are read, and what vLLM and Ollama return for a generative model). Each
input is tokenised here first, so a text past the context is named (or, for Ollama's
`truncate`, cut) before anything is queued; then all go to the engine together and batch
like any prefill.
"""

import base64
import struct
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse

from kvdeck.app.serve.admission import (
    Fields,
    ServeState,
    bad_prompt,
    check_choice_count,
    check_engine,
    check_model,
    submit,
)
from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.ollama_models import check_ollama_model
from kvdeck.app.serve.ollama_protocol import OllamaEmbedRequest
from kvdeck.app.serve.protocol import EmbeddingRequest
from kvdeck.app.serve.streaming import run_to_end
from kvdeck.engine.types.lora import LoRARequest
from kvdeck.engine.types.sampling_params import RequestOutputKind, embedding_params


async def create_embedding(state: ServeState, req: EmbeddingRequest, raw: Request) -> JSONResponse:
    lora = check_model(state, req.model)
    check_engine(state)
    check_dimensions(state, req.dimensions)
    texts = [req.input] if isinstance(req.input, str) else req.input
    inputs = [texts] if texts and isinstance(texts[0], int) else texts
    check_choice_count(state, len(inputs), "input")
    prompts = [await _token_ids(state, text, truncate=False) for text in inputs]
    vectors = await embed(state, prompts, raw, lora)
    data = [{"object": "embedding", "index": i,
             "embedding": _base64(vector) if req.encoding_format == "base64" else vector}
            for i, vector in enumerate(vectors)]
    tokens = sum(len(ids) for ids in prompts)
    return JSONResponse({"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                         "model": lora.lora_name if lora is not None else state.model_name, "data": data,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def ollama_embed(state: ServeState, req: OllamaEmbedRequest, raw: Request,
                       legacy: bool) -> JSONResponse:
    """/api/embed: {"embeddings": [...]} for `input`; legacy /api/embeddings: {"embedding"}
    for `prompt`. An empty input is Ollama's "load the model" call: nothing to embed."""
    started = time.time()
    lora = check_ollama_model(state, req.model)
    check_engine(state)
    check_dimensions(state, req.dimensions)
    if legacy:
        texts = [req.prompt] if req.prompt else []
    else:
        texts = ([req.input] if req.input else []) if isinstance(req.input, str) else req.input
    if any(not text for text in texts):
        raise OpenAIError(400, "input must not hold an empty text", param="input")
    check_choice_count(state, len(texts), "input")
    prompts = [await _token_ids(state, text, truncate=req.truncate) for text in texts]
    vectors = await embed(state, prompts, raw, lora) if prompts else []
    if legacy:
        return JSONResponse({"embedding": vectors[0] if vectors else []})
    took = int((time.time() - started) * 1e9)
    return JSONResponse({"model": req.model, "embeddings": vectors, "total_duration": took,
                         "load_duration": 0, "prompt_eval_count": sum(len(ids) for ids in prompts)})


async def embed(state: ServeState, prompts: list[list[int]], raw: Request,
                lora: LoRARequest | None) -> list[list[float]]:
    """Each prompt's normalised embedding, the prompts batched in the engine."""
    params = embedding_params(RequestOutputKind.FINAL_ONLY)
    request_id = f"embd-{uuid.uuid4().hex}"
    streams = await submit(state, [(f"{request_id}-{i}", ids) for i, ids in enumerate(prompts)], params,
                           Fields("input", None, True), lora_request=lora)
    finals = await run_to_end(streams, raw, state.drain)
    return [outs[0].embedding for outs in finals]


def check_dimensions(state: ServeState, dimensions: int | None) -> None:
    """`dimensions` shortens a Matryoshka model's vectors; kvdeck's models give their hidden
    size only (as vLLM refuses other sizes for a model trained without it)."""
    size = state.engine.info.hidden_size if state.engine.info is not None else 0
    if dimensions is not None and dimensions != size:
        raise OpenAIError(400, f"dimensions {dimensions} is not this model's embedding size ({size}); "
                               "only Matryoshka-trained models can be shortened: leave it out",
                          param="dimensions")


async def _token_ids(state: ServeState, text: str | list[int], truncate: bool) -> list[int]:
    """The input's token ids, within the context (one position stays for the token the
    engine samples after the prefill); `truncate` keeps the first ones instead of refusing."""
    if isinstance(text, str):
        try:
            _, ids = await state.engine.encode_async(text)
        except ValueError as exc:
            raise bad_prompt(exc, "input") from None
    else:
        ids = list(text)
    limit = state.engine.max_model_len - 1
    if len(ids) > limit:
        if not truncate:
            raise OpenAIError(400, f"this model's maximum context length is {state.engine.max_model_len} "
                                   f"tokens; an input has {len(ids)}: shorten it", param="input",
                              code="context_length_exceeded")
        ids = ids[:limit]
    return ids


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
