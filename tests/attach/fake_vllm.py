"""A stand-in for a vLLM deployment on loopback: the OpenAI API (a fixed streamed reply) and
a /metrics exposition in vLLM's format (its metric names, types, `model_name` and `engine`
labels, its histogram buckets), whose values the test moves by observing known samples."""

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MODEL = "Qwen/Qwen3-0.6B"
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
REPLY = ["Paged", " attention", " keeps", " the", " cache", " in", " blocks", "."]


class VllmMetrics:
    def __init__(self, engines: int = 1) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        reg = self.registry
        self.running = Gauge("vllm:num_requests_running", "Running.", labels, registry=reg)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting.", labels, registry=reg)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV usage.", labels, registry=reg)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions.", labels, registry=reg)
        self.generation = Counter("vllm:generation_tokens", "Generated.", labels, registry=reg)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt.", labels, registry=reg)
        self.queries = Counter("vllm:prefix_cache_queries", "Queried.", labels, registry=reg)
        self.hits = Counter("vllm:prefix_cache_hits", "Hit.", labels, registry=reg)
        self.drafts = Counter("vllm:spec_decode_num_draft_tokens", "Drafted.", labels, registry=reg)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted.", labels, registry=reg)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", labels,
                              buckets=TTFT_BUCKETS, registry=reg)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL.", labels,
                             buckets=ITL_BUCKETS, registry=reg)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E.", labels,
                             buckets=REQUEST_BUCKETS, registry=reg)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Queue.", labels,
                               buckets=REQUEST_BUCKETS, registry=reg)
        self.engines = [str(i) for i in range(engines)]
        for engine in self.engines:
            for metric in (self.running, self.waiting, self.kv, self.preemptions, self.generation,
                           self.prompt, self.queries, self.hits, self.drafts, self.accepted, self.ttft,
                           self.itl, self.e2e, self.queue):
                metric.labels(MODEL, engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class Behaviour:
    """What the test makes the fake do: want a key, or stall every answer."""

    api_key: str | None = None
    stall_s: float = 0.0
    completions: int = 0  # /v1/completions requests answered (the load generator's)


def create_app(metrics: VllmMetrics, behaviour: Behaviour | None = None) -> FastAPI:
    app = FastAPI()
    behaviour = behaviour or Behaviour()

    @app.middleware("http")
    async def key_and_stall(request, call_next):
        if behaviour.stall_s:
            await asyncio.sleep(behaviour.stall_s)
        if behaviour.api_key and request.headers.get("authorization") != f"Bearer {behaviour.api_key}":
            return JSONResponse({"error": {"message": "Unauthorized", "type": "invalid_request_error",
                                           "code": 401}}, status_code=401)
        return await call_next(request)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 4096}]})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.post("/tokenize")
    async def tokenize(body: dict) -> JSONResponse:  # vLLM's shape; ids from a fixed map
        words = str(body.get("prompt", "")).split()
        tokens = [3 + sum(map(ord, word)) % 997 for word in words]
        return JSONResponse({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    @app.post("/v1/completions")
    async def completions(body: dict):
        behaviour.completions += 1

        def events():
            base = {"id": "cmpl-x", "object": "text_completion", "model": MODEL}
            for piece in REPLY[:int(body.get("max_tokens") or len(REPLY))]:
                chunk = {**base, "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            last = {**base, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
            yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        def events():
            base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": MODEL}
            for piece in REPLY:
                chunk = {**base, "choices": [{"index": 0, "delta": {"content": piece},
                                               "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@dataclass
class RunningServer:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: FastAPI, port: int | None = None) -> RunningServer:
    """Run `app` on loopback in a thread; stop() closes open streams within a second."""
    if port is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the fake server did not start")
        time.sleep(0.05)
    return RunningServer(f"http://127.0.0.1:{port}", server, thread)
