"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status;
under /api/ (Ollama's API) Ollama's shape, `{"error": "message"}`; under /v1/messages
(Anthropic's API) Anthropic's, `{"type": "error", "error": {"type", "message"}}`.

Every failure the server answers goes through here, including FastAPI's own (malformed
JSON and type errors become 400, unknown routes 404), so each API's clients see its shape.
"""

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class OpenAIError(Exception):
    """`retry_after` (seconds): the condition may pass (429, 503); sent as Retry-After."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def headers(self) -> dict[str, str] | None:
        if self.status == 401:
            return {"WWW-Authenticate": "Bearer"}
        if self.retry_after is not None:
            return {"Retry-After": str(max(1, round(self.retry_after)))}
        return None

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


OLLAMA_PREFIX = "/api/"  # Ollama's API: its clients read `error` as the message string
ANTHROPIC_PREFIX = "/v1/messages"  # Anthropic's API: its error object, its error types
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                       "message": message}}


def error_response(error: OpenAIError, headers: dict | None = None, path: str = "") -> JSONResponse:
    """`path`: the request's; under OLLAMA_PREFIX or ANTHROPIC_PREFIX the body takes that
    API's shape."""
    if path.startswith(OLLAMA_PREFIX):
        body = {"error": error.message}
    elif path.startswith(ANTHROPIC_PREFIX):
        body = anthropic_error_body(error.status, error.message)
    else:
        body = error.body()
    return JSONResponse(body, status_code=error.status,
                        headers={**(error.headers() or {}), **(headers or {})} or None)


def bad_request(exc: ValueError, known_fields: frozenset[str] = frozenset()) -> OpenAIError:
    """A ValueError from validation; its message starts with the field it is about."""
    message = str(exc)
    first_word = message.split(" ", 1)[0].rstrip(":").split("[", 1)[0]
    param = first_word if first_word in known_fields else None
    return OpenAIError(400, message, param=param, code="invalid_value" if param else None)


def sse_error(error: OpenAIError) -> str:
    """An error in the middle of a stream: one data event the openai client raises on."""
    return f"data: {json.dumps(error.body())}\n\n"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc, path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_from_validation(exc), path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        # Starlette's own headers (Allow on a 405) are part of the answer.
        return error_response(OpenAIError(exc.status_code, message), headers=exc.headers,
                              path=request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}"),
                              path=request.url.path)


def _from_validation(exc: RequestValidationError) -> OpenAIError:
    errors = exc.errors()
    if not errors:
        return OpenAIError(400, "invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return OpenAIError(400, f"malformed JSON body: {first.get('msg', '')}",
                           code="invalid_json")
    param = _param(first)
    loc = param.split(".") if param else []
    if not loc and first.get("type") in ("missing", "model_attributes_type", "dict_type"):
        return OpenAIError(400, "the request body must be a JSON object", code="invalid_json")
    message = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        message = "field required"
    elif first.get("type") == "value_error":  # our validators' words, without pydantic's prefix
        message = str(first.get("ctx", {}).get("error", message))
    summary = f"{param}: {message}" if param else message
    others = {_param(e) for e in errors} - {param}  # union branches repeat the same field
    if others:
        summary += f" (also: {', '.join(sorted(str(o) for o in others))})"
    return OpenAIError(400, summary, param=param,
                       code="missing_field" if first.get("type") == "missing" else "invalid_type")


def _param(error: dict) -> str | None:
    loc = [str(p) for p in error.get("loc", ()) if p != "body" and not _is_type_tag(p)]
    return ".".join(loc) or None


_TYPE_TAGS = {"float", "int", "str", "bool", "dict", "list", "none", "null"}


def _is_type_tag(part: object) -> bool:
    """pydantic names union branches in `loc` ("temperature.float"); they are not fields."""
    if not isinstance(part, str):
        return False
    return (part in _TYPE_TAGS or "[" in part or part[:1].isupper()
            or part.startswith(("function-", "constrained-")))
