"""vLLM's runtime adapter routes, `POST /v1/load_lora_adapter` {"lora_name", "lora_path"} and
`POST /v1/unload_lora_adapter` {"lora_name"}, with vLLM's answers: 200 and a plain-text
"Success: ..." line; 400 for a name already loaded or a folder that is not a servable
adapter (read and checked here, then loaded by the engine, before the name is registered);
404 for an unknown name to unload. They answer 404 unless the server was started with
`--allow-runtime-lora` (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).

Unloading is vLLM's too: the name goes at once (new requests naming it get 404), requests
already running under the adapter finish under it; the engine drops its copy when the last
of them ends. Also here: /v1/models' adapter cards and the start-up preload of the
`--lora-modules` adapters.
"""

import asyncio
import logging

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

from kvdeck.app.serve.admission import ServeState, check_engine
from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.lora_adapters import AdapterRegistry
from kvdeck.app.serve.openapi import errors
from kvdeck.engine.api.async_llm import AsyncLLM, EngineDeadError, EngineNotReadyError
from kvdeck.engine.types.outputs import RequestOutput

logger = logging.getLogger("kvdeck.serve")

# Success is vLLM's plain-text line; errors are JSON (so no response_class: it would type them).
LORA_ROUTE_RESPONSES = {200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Success: the adapter was loaded or unloaded"},
                        **errors(400, 401, 404, 413, 503)}


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr
    lora_path: StrictStr


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr
    lora_int_id: StrictInt | None = None  # vLLM's; the name is what picks the adapter


def install_lora_routes(app: FastAPI, state: ServeState, registry: AdapterRegistry,
                        allow_runtime: bool) -> None:
    pending: set[asyncio.Task] = set()  # engine removals under way

    def drop_later(lora_ids: list[int]) -> None:
        for lora_id in lora_ids:
            task = asyncio.get_running_loop().create_task(drop_adapter(state.engine, lora_id))
            pending.add(task)
            task.add_done_callback(pending.discard)

    def observe(output: RequestOutput) -> None:
        drop_later(registry.observe_output(output))

    state.engine.add_output_listener(observe)

    @app.post("/v1/load_lora_adapter", responses=LORA_ROUTE_RESPONSES)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        """Load a PEFT LoRA adapter and serve it as `lora_name` (vLLM's route)."""
        _check_runtime(allow_runtime)
        if not body.lora_name or not body.lora_path:
            raise OpenAIError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                              param="lora_name" if not body.lora_name else "lora_path")
        try:
            registry.check_name(body.lora_name)
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="lora_name") from None
        try:
            info = registry.check_new(body.lora_name, body.lora_path)
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="lora_path") from None
        check_engine(state)
        lora = registry.new_request(body.lora_name, info)
        registry.loading.add(lora.lora_name)  # a second load of the name is refused meanwhile
        try:
            await state.engine.add_lora(lora)
        except ValueError as exc:
            raise OpenAIError(400, f"LoRA adapter {body.lora_name!r}: {exc}",
                              param="lora_path") from None
        except (EngineDeadError, EngineNotReadyError) as exc:
            raise OpenAIError(503, f"the engine is not running: {exc}", code="engine_unavailable",
                              retry_after=5) from None
        finally:
            registry.loading.discard(lora.lora_name)
        registry.add(lora, info)
        logger.info("loaded LoRA adapter %r from %s (rank %d)", lora.lora_name, info.path, info.rank)
        return PlainTextResponse(f"Success: LoRA adapter '{lora.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", responses=LORA_ROUTE_RESPONSES)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        """Stop serving an adapter; its requests still running finish under it."""
        _check_runtime(allow_runtime)
        if registry.get(body.lora_name) is None:
            raise OpenAIError(404, f"The lora adapter '{body.lora_name}' cannot be found.",
                              param="lora_name", code="model_not_found")
        lora, idle = registry.remove(body.lora_name)
        if idle:
            await drop_adapter(state.engine, lora.lora_int_id)
        logger.info("unloaded LoRA adapter %r%s", lora.lora_name,
                    "" if idle else " (its running requests finish under it)")
        return PlainTextResponse(f"Success: LoRA adapter '{lora.lora_name}' removed successfully.")


def _check_runtime(allow_runtime: bool) -> None:
    if not allow_runtime:
        raise OpenAIError(404, "loading and unloading LoRA adapters at runtime is off: start the "
                               "server with --enable-lora --allow-runtime-lora (vLLM's "
                               "VLLM_ALLOW_RUNTIME_LORA_UPDATING)", code="runtime_lora_disabled")


async def drop_adapter(engine: AsyncLLM, lora_id: int) -> None:
    """Ask the engine to drop an adapter's copies (a stopped engine holds none)."""
    try:
        await engine.remove_lora(lora_id)
    except (EngineDeadError, EngineNotReadyError):
        pass
    except Exception:
        logger.exception("dropping LoRA adapter %d failed", lora_id)


async def preload_adapters(engine: AsyncLLM, registry: AdapterRegistry) -> str | None:
    """Load the `--lora-modules` adapters into the started engine (so a bad one is found at
    start, and the first request under each pays no load); the failure's message, if any."""
    for adapter in registry.served():
        try:
            await engine.add_lora(adapter.request)
        except ValueError as exc:
            return f"--lora-modules {adapter.name}={adapter.info.path}: {exc}"
    return None


def adapter_cards(registry: AdapterRegistry, created: int) -> list[dict]:
    """/v1/models' entries for the adapters, in vLLM's shape (`parent`: the base model's id,
    `root`: the adapter's folder)."""
    return [{"id": a.name, "object": "model", "created": created, "owned_by": "kvdeck",
             "root": a.info.path, "parent": a.parent, "max_model_len": None}
            for a in registry.served()]
