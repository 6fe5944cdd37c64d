"""The OpenAPI document says what the server does: every error status a route answers
(with OpenAI's error object; FastAPI's default 422 is never answered, validation errors are
400), SSE as a second 200 media type (one event: its `data`), /metrics as Prometheus text,
and the one model name requests may give."""

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error object, on /v1/messages."""

    type: str
    error: AnthropicErrorDetail


class HealthResponse(BaseModel):
    status: str  # starting | ready | dead | stopped
    detail: str
    model: str


_DESCRIPTIONS = {
    400: "Invalid request: it can never succeed as sent",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Request body over the limit",
    429: "Queue full; retry after the Retry-After header's seconds",
    500: "The engine could not complete this request (the server goes on)",
    503: "The engine is starting or restarting (Retry-After), or the server is shutting down",
}


def errors(*statuses: int) -> dict:
    return {status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]}
            for status in statuses}


def anthropic_errors(*statuses: int) -> dict:
    return {status: {"model": AnthropicErrorResponse, "description": _DESCRIPTIONS[status]}
            for status in statuses}


SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string",
                                     "description": "a JSON chunk, an error object, or [DONE]"}}}
GENERATE_RESPONSES = {200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                            "description": "A JSON completion, or Server-Sent Events with stream"},
                      **errors(400, 401, 404, 413, 429, 500, 503)}
TOKENS_RESPONSES = errors(400, 401, 404, 413, 503)
ANTHROPIC_MESSAGE_RESPONSES = {200: GENERATE_RESPONSES[200],
                               **anthropic_errors(400, 401, 404, 413, 429, 500, 503)}
ANTHROPIC_COUNT_RESPONSES = anthropic_errors(400, 401, 404, 413, 503)
EMBEDDING_RESPONSES = errors(400, 401, 404, 413, 429, 500, 503)
STATS_RESPONSES = {200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                         "description": "The engine's snapshots as Server-Sent Events (kvdeck attach)"},
                   **errors(401)}
METRICS_RESPONSES = {200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                           "description": "Prometheus text exposition"}}


def install_openapi(app: FastAPI, model_names: list[str], lora_enabled: bool = False) -> None:
    """Generate the document once, without the 422s FastAPI adds to routes with a body;
    `model_names`: the served name and its aliases, the names a request's model may be
    (`lora_enabled`: or a LoRA adapter's, which may change while the server runs)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                components.pop(unused, None)
            for body in components.values():
                if "model" in body.get("properties", {}):  # another name is a 404
                    names = {"type": "string", "description": "the base model's name (" + ", ".join(
                        model_names) + ") or a LoRA adapter's (GET /v1/models)"} \
                        if lora_enabled else {"enum": model_names}
                    body["properties"]["model"] = {"anyOf": [names, {"type": "null"}],
                                                   "default": None, "title": "Model"}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
