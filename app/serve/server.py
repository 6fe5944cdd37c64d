"""`kvdeck --serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) on the AsyncLLM.

The server listens at once and starts the engine in the background: /health answers
503 "starting" while the model loads, 200 when ready, 503 "dead" after a crash. A crashed
engine is started again after `engine_restart_delay` seconds (doubling while restarts
keep failing, up to a minute), so the server keeps serving. Routes:
/v1/models (and /v1/models/{model}), /v1/completions, /v1/chat/completions, /tokenize,
/detokenize, /kvdeck/v1/*
(info, stats, requests/{id}) and Ollama's /api/* (ollama_routes.py) (these need the API key
when one is set), /health, /metrics and
`GET /` (open, for probes and Prometheus).
Bodies over the limit get 413 before they are parsed; SIGTERM drains (shutdown.py).
"""

import asyncio
import errno
import hmac
import ipaddress
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvdeck.app.record.session import SessionRecorder, record_engine
from kvdeck.app.serve.admission import (
    ServeState,
    bad_prompt,
    check_chat_template_kwargs,
    check_engine,
    check_model,
)
from kvdeck.app.serve.anthropic_routes import install_anthropic_routes
from kvdeck.app.serve.embeddings import create_embedding
from kvdeck.app.serve.errors import OpenAIError, error_response, install_error_handlers
from kvdeck.app.serve.limits import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from kvdeck.app.serve.lora_adapters import LoRAModule, registry_from_modules
from kvdeck.app.serve.lora_routes import adapter_cards, install_lora_routes, preload_adapters
from kvdeck.app.serve.metrics import CONTENT_TYPE, EngineMetrics
from kvdeck.app.serve.ollama_routes import install_ollama_routes
from kvdeck.app.serve.openai_routes import create_chat_completion, create_completion
from kvdeck.app.serve.openapi import (
    EMBEDDING_RESPONSES,
    GENERATE_RESPONSES,
    METRICS_RESPONSES,
    STATS_RESPONSES,
    TOKENS_RESPONSES,
    HealthResponse,
    errors,
    install_openapi,
)
from kvdeck.app.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)
from kvdeck.app.serve.request_timelines import RequestTimelines
from kvdeck.app.serve.responses_routes import install_responses_routes
from kvdeck.app.serve.served_name import served_names
from kvdeck.app.serve.shutdown import Drain, GracefulServer
from kvdeck.app.serve.stats_stream import EndedFeed, LatencyFeed, engine_info, stats_events
from kvdeck.engine.api.async_llm import AsyncLLM, EngineStartError
from kvdeck.engine.frontend.reasoning import reasoning_format

logger = logging.getLogger("kvdeck.serve")
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/kvdeck/", "/api/")


MAX_RESTART_DELAY = 60.0


def create_app(client: AsyncLLM, *, served_model_name: str | None = None,
               api_key: str | None = None, max_queue_len: int = 256,
               on_start_failed: Callable[[str], None] | None = None,
               engine_restart_delay: float | None = 1.0,
               allowed_origins: list[str] | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               drain: Drain | None = None, tool_call_parser: str | None = None,
               model_aliases: tuple[str, ...] = (), lora_modules: tuple[LoRAModule, ...] = (),
               allow_runtime_lora: bool = False, recorder: SessionRecorder | None = None,
               reasoning_parser: str | None = None) -> FastAPI:
    """The app; its lifespan starts the engine (in the background) and shuts it down.

    `engine_restart_delay` None: a crashed engine stays down (health 503 "dead").
    `allowed_origins`: browser origins allowed by CORS (None: no CORS headers).
    `drain`: set by the server on SIGTERM (requests then get 503, streams are cut later).
    `model_aliases`: more names requests may give the model (served_name.py finds the rest).
    `lora_modules`: LoRA adapters served by name (checked here: ValueError naming a bad one);
    `allow_runtime_lora`: the load/unload routes work (lora_routes.py).
    `recorder`: `--record FILE`: every snapshot, latency and finished request is recorded.
    `reasoning_parser`: a thinking model's reasoning apart from its answer (reasoning.py).
    """
    names = served_names(client.model_name, override=served_model_name, aliases=model_aliases)
    model_name = names.name
    lora = client.config
    if allow_runtime_lora and not lora.enable_lora:
        raise ValueError("--allow-runtime-lora needs --enable-lora")
    adapters = registry_from_modules(list(lora_modules), base_name=model_name,
                                     reserved=names.aliases, enabled=lora.enable_lora,
                                     max_lora_rank=lora.max_lora_rank)
    metrics = EngineMetrics(model_name, lambda: client.last_stats, client,
                            lora.max_loras if lora.enable_lora else None)
    client.add_output_listener(metrics.observe_output)
    latencies = LatencyFeed()
    client.add_output_listener(latencies.observe)
    ended = EndedFeed()
    client.add_output_listener(ended.observe)
    timelines = RequestTimelines(lambda: client.last_stats)
    client.add_output_listener(timelines.observe)
    state = ServeState(client, metrics, model_name, max_queue_len, drain or Drain(),
                       engine_restart_delay, tool_call_parser, names.aliases, adapters,
                       reasoning_format(reasoning_parser) if reasoning_parser else None)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = []
        if client.health().status not in ("ready", "starting"):
            tasks.append(asyncio.create_task(_start_engine(client, model_name, on_start_failed,
                                                           engine_restart_delay, state)))
        if recorder is not None:
            tasks.append(asyncio.create_task(record_engine(client, recorder, model_name)))
        yield
        for task in tasks:
            task.cancel()
        if recorder is not None:
            recorder.close()
        await client.shutdown()

    app = FastAPI(title="kvdeck", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.serve = state
    install_error_handlers(app)
    install_openapi(app, [model_name, *sorted(names.aliases)], lora.enable_lora)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    if allowed_origins:
        from fastapi.middleware.cors import CORSMiddleware

        # Added last, so it runs first: preflight requests never reach the key check.
        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"],
                           allow_headers=["*"])

    @app.get("/health", response_model=HealthResponse, responses=errors(503))
    async def health() -> JSONResponse:
        h = client.health()
        body = {"status": h.status, "detail": h.detail, "model": model_name}
        return JSONResponse(body, status_code=200 if h.status == "ready" else 503)

    @app.get("/metrics", response_class=Response, responses=METRICS_RESPONSES)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/kvdeck/v1/info", responses=errors(401))
    async def kvdeck_info() -> JSONResponse:
        return JSONResponse(engine_info(client, model_name))

    @app.get("/kvdeck/v1/stats", response_class=StreamingResponse, responses=STATS_RESPONSES)
    async def kvdeck_stats(raw: Request) -> StreamingResponse:
        return StreamingResponse(stats_events(client, latencies, ended, model_name, raw),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/kvdeck/v1/requests/{request_id}", responses=errors(401, 404))
    async def kvdeck_request(request_id: str) -> JSONResponse:
        """One request's timeline, TTFT parts and reason line (request_timelines.py)."""
        return JSONResponse(timelines.describe(request_id))

    def model_cards() -> list[dict]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "kvdeck",
                "root": str(client.model_dir or client.model_name), "parent": None,
                "max_model_len": client.max_model_len or None}
        return [card, *adapter_cards(adapters, created)]

    @app.get("/v1/models", responses=errors(401))
    async def list_models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": model_cards()})

    @app.get("/v1/models/{model:path}", responses=errors(401, 404))
    async def retrieve_model(model: str) -> JSONResponse:
        """OpenAI's models.retrieve: the card of the served model (by any of its names) or of
        an adapter; 404 model_not_found otherwise."""
        lora = check_model(state, model)
        wanted = lora.lora_name if lora is not None else model_name
        for card in model_cards():
            if card["id"] == wanted:
                return JSONResponse(card)
        raise OpenAIError(404, f"the model {model!r} does not exist", param="model",  # unloaded just now
                          code="model_not_found")

    @app.post("/v1/completions", responses=GENERATE_RESPONSES)
    async def completions(body: CompletionRequest, raw: Request):
        return await create_completion(state, body, raw)

    @app.post("/v1/chat/completions", responses=GENERATE_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        return await create_chat_completion(state, body, raw)

    @app.post("/v1/embeddings", responses=EMBEDDING_RESPONSES)
    async def embeddings(body: EmbeddingRequest, raw: Request):
        return await create_embedding(state, body, raw)

    @app.post("/tokenize", responses=TOKENS_RESPONSES)
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        check_model(state, body.model)
        check_engine(state)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError(400, "give exactly one of prompt or messages", param="prompt")
        check_chat_template_kwargs(body.chat_template_kwargs)
        try:
            if body.messages is not None:
                messages = [m.for_template() for m in body.messages]
                _, ids = await client.encode_async(messages=messages,
                                                   chat_template_kwargs=body.chat_template_kwargs)
            elif body.add_special_tokens:
                _, ids = await client.encode_async(body.prompt)
            else:
                ids = await client.encode_async_plain(body.prompt)
        except ValueError as exc:
            raise bad_prompt(exc, "messages" if body.messages else "prompt") from None
        return JSONResponse({"tokens": ids, "count": len(ids),
                             "max_model_len": client.max_model_len})

    @app.post("/detokenize", responses=TOKENS_RESPONSES)
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        check_model(state, body.model)
        check_engine(state)
        bad = [t for t in body.tokens if not 0 <= t < client.vocab_size]
        if bad:
            raise OpenAIError(400, f"tokens must be in [0, {client.vocab_size}), got {bad[0]}",
                              param="tokens")
        return JSONResponse({"prompt": await client.decode_async(body.tokens)})

    install_ollama_routes(app, state)
    install_responses_routes(app, state)
    install_anthropic_routes(app, state)
    install_lora_routes(app, state, adapters, allow_runtime_lora)
    return app


class ApiKeyMiddleware:
    """Bearer-token check in front of the API routes (before the body is even parsed); the
    key in `x-api-key` passes too, as Anthropic's clients send it."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES):
            headers = dict(scope.get("headers") or [])
            scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            bearer = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                        self.expected)
            if not bearer and not hmac.compare_digest(headers.get(b"x-api-key", b"").strip(),
                                                      self.expected):
                error = OpenAIError(401, "invalid or missing API key (send 'Authorization: "
                                         "Bearer KEY' or 'x-api-key: KEY')", code="invalid_api_key")
                response = error_response(error, headers={"WWW-Authenticate": "Bearer"},
                                          path=scope["path"])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _log_progress(p) -> None:
    logger.info("engine %s: %s", p.stage, p.message)


async def _start_engine(client: AsyncLLM, model_name: str,
                        on_failed: Callable[[str], None] | None, restart_delay: float | None,
                        state: ServeState | None = None) -> None:
    try:
        await client.start(on_progress=_log_progress)
        failure = await preload_adapters(client, state.adapters) \
            if state is not None and state.adapters is not None else None
    except EngineStartError as exc:
        failure = str(exc)
    if failure is not None:
        logger.error("the engine failed to start: %s", failure)
        if on_failed is not None:
            on_failed(failure)
        return
    logger.info("serving %s (max_model_len %d)", model_name, client.max_model_len)
    if restart_delay is not None:
        await _restart_when_dead(client, restart_delay)


async def _restart_when_dead(client: AsyncLLM, delay: float) -> None:
    """Watch the engine; when it dies, start a new one (requests in flight have already
    ended with an error; new ones get 503 until it is ready)."""
    wait = delay
    while True:
        await asyncio.sleep(0.2)
        health = client.health()
        if health.status != "dead":
            continue
        logger.error("the engine is down (%s); restarting it in %.1f s", health.detail, wait)
        await asyncio.sleep(wait)
        try:
            await client.restart()
        except EngineStartError as exc:
            logger.error("restarting the engine failed: %s", exc)
            wait = min(max(wait, 0.5) * 2, MAX_RESTART_DELAY)
            continue
        logger.info("the engine is back (max_model_len %d)", client.max_model_len)
        wait = delay


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it could resolve to anything


def run_server(args, engine_kwargs: dict, requested_model: str | None = None) -> int:
    """Entry point of `kvdeck --serve`; returns the process exit code. `requested_model`:
    `--model` as the user typed it, before it was resolved (requests may name it so)."""
    api_key = args.api_key or os.environ.get("KVDECK_API_KEY") or None
    if not is_loopback(args.host):
        if not api_key and not args.allow_insecure_bind:
            print(f"kvdeck: error: refusing to bind {args.host} (not loopback) without --api-key;"
                  " anyone on the network could use the model. Set --api-key, or pass "
                  "--allow-insecure-bind if you really mean it.", file=sys.stderr)
            return 2
        if not api_key:
            print(f"kvdeck: WARNING: serving on {args.host} without an API key: anyone who can "
                  "reach this port can use the model.", file=sys.stderr)
    if args.engine_restart_delay < 0:
        raise ValueError(f"--engine-restart-delay must be >= 0, got {args.engine_restart_delay}")
    if args.max_queue_len < 1:
        raise ValueError(f"--max-queue-len must be >= 1, got {args.max_queue_len}")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if not args.max_request_body_mb > 0:
        raise ValueError(f"--max-request-body-mb must be > 0, got {args.max_request_body_mb}")
    if not args.shutdown_grace_period >= 0:
        raise ValueError(f"--shutdown-grace-period must be >= 0, got {args.shutdown_grace_period}")
    listener = bind_listener(args.host, args.port)  # before the engine: a taken port fails fast
    with listener:  # closed however the server ends (uvicorn closes it too)
        return _serve_on(listener, args, engine_kwargs, api_key, requested_model)


def _serve_on(listener: socket.socket, args, engine_kwargs: dict, api_key: str | None,
              requested_model: str | None) -> int:
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    # uvicorn says where it runs only for the sockets it binds itself
    base = f"http://{shown_host}:{args.port}"
    logger.info("listening on %s (ctrl+c quits); base URL for OpenAI's clients %s/v1, for "
                "Anthropic's and Ollama's %s", base, base, base)
    client = AsyncLLM(args.model, **engine_kwargs)
    failures: list[str] = []
    server: uvicorn.Server | None = None

    def start_failed(message: str) -> None:
        failures.append(message)
        if server is not None:
            server.should_exit = True

    drain = Drain()
    app = create_app(client, served_model_name=args.served_model_name, api_key=api_key,
                     max_queue_len=args.max_queue_len, on_start_failed=start_failed,
                     engine_restart_delay=args.engine_restart_delay if args.restart_engine else None,
                     allowed_origins=args.allowed_origins,
                     max_body_bytes=int(args.max_request_body_mb * (1 << 20)), drain=drain,
                     tool_call_parser=args.tool_call_parser,
                     model_aliases=(requested_model,) if requested_model else (),
                     lora_modules=tuple(args.lora_modules or ()),
                     allow_runtime_lora=args.allow_runtime_lora,
                     reasoning_parser=args.reasoning_parser,
                     recorder=SessionRecorder(args.record, args.record_max_mb)
                     if getattr(args, "record", None) else None)
    # uvicorn's own timeout only backs ours up: the streams end themselves at the grace period.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                            timeout_graceful_shutdown=args.shutdown_grace_period + 5, access_log=False)
    server = GracefulServer(config, drain, args.shutdown_grace_period)
    server.run(sockets=[listener])
    if failures:
        print(f"kvdeck: error: the engine failed to start: {failures[0]}", file=sys.stderr)
        return 1
    return 0 if server.started else 1


def bind_listener(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine loads (as vLLM does), so a port another
    server holds is a clear error at once rather than uvicorn's after the model loaded."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn's own choice
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        why = ("in use: another server listens there (stop it, or pass another --port)"
               if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc))
        raise ValueError(f"cannot listen on {host}:{port}: {why}") from None
    return sock
