"""Ollama's model-management routes, answered the way a one-model server can.

Apps written for Ollama call `/api/pull` to make sure their model is there before they use
it; for the model this server serves (or one of its adapters) that is true, so the pull
succeeds at once, in Ollama's words (`{"status": "success"}`, a line of NDJSON when
streamed). Any other name is a 404 that says where models come from. Creating, copying,
deleting and pushing models and uploading blobs change a model store the server does not
own: 501, naming the kvdeck commands that do it.
"""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from kvdeck.app.serve.admission import ServeState
from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.ollama_models import check_ollama_model
from kvdeck.app.serve.ollama_protocol import OllamaPullRequest, parse_body
from kvdeck.app.serve.ollama_replies import NDJSON, ndjson

_STORE_COMMANDS = ("manage models with `kvdeck pull`, `kvdeck import`, `kvdeck quantize`, "
                   "`kvdeck models` and `kvdeck rm`, then start the server with --model")


def install_model_management_routes(app: FastAPI, state: ServeState) -> None:
    @app.post("/api/pull", include_in_schema=False)
    async def pull(raw: Request) -> Response:
        req = await parse_body(raw, OllamaPullRequest)
        if not req.model:
            raise OpenAIError(400, "model is required", param="model")
        try:
            check_ollama_model(state, req.model)
        except OpenAIError as exc:
            raise OpenAIError(404, f"{exc.message}; kvdeck's server does not download models: "
                                   f"run `kvdeck pull REPO` (a Hugging Face model) or `kvdeck "
                                   f"import ollama:NAME`, then start the server with --model",
                              param="model") from None
        done = {"status": "success"}  # the model is here and loaded: nothing to fetch
        if req.stream:
            return Response(ndjson(done), media_type=NDJSON)
        return JSONResponse(done)

    for method, path, what in (("POST", "/api/create", "create models"),
                               ("POST", "/api/copy", "copy models"),
                               ("DELETE", "/api/delete", "delete models"),
                               ("POST", "/api/push", "push models"),
                               ("POST", "/api/blobs/{digest}", "take blobs"),
                               ("HEAD", "/api/blobs/{digest}", "keep blobs")):
        app.add_api_route(path, _not_served(what), methods=[method], include_in_schema=False)


def _not_served(what: str):
    async def refuse() -> Response:
        raise OpenAIError(501, f"kvdeck's server serves the model it was started with and does "
                               f"not {what}: {_STORE_COMMANDS}")
    return refuse
