"""The LoRA adapters the server serves by name, as vLLM's server does: `--lora-modules
NAME=DIR` at start, `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` while it runs
(lora_routes.py). A request picks an adapter by giving its name as `model`.

Each adapter gets a `LoRARequest` with an id of its own, never reused (a name loaded again
after an unload is a new adapter to the engine, even from another folder). Names may not
clash with the base model's names. Unloading takes the name away at once; requests already
running under the adapter finish under it, and the engine drops its copy when the last of
them ends (`observe_output` says when).
"""

import argparse
import json
from dataclasses import dataclass, field

from kvdeck.engine.frontend.parent_request import ParentRequest
from kvdeck.engine.types.lora import LoRAAdapterInfo, LoRARequest, read_adapter_info
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class LoRAModule:
    """One `--lora-modules` entry (vLLM's LoRAModulePath)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModule:
    """`NAME=DIR`, or vLLM's JSON form `{"name": .., "path": .., "base_model_name": ..}`;
    argparse.ArgumentTypeError naming the problem (argparse prints it)."""
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) \
                or not isinstance(value.get("path"), str) or not value["name"] or not value["path"]:
            raise argparse.ArgumentTypeError(
                f"a JSON adapter needs string fields \"name\" and \"path\", got {text!r}")
        unknown = sorted(set(value) - {"name", "path", "base_model_name"})
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown field(s) {', '.join(unknown)} in {text!r} "
                                             "(known: name, path, base_model_name)")
        base = value.get("base_model_name")
        if base is not None and not isinstance(base, str):
            raise argparse.ArgumentTypeError(f"base_model_name must be a string, got {base!r}")
        return LoRAModule(value["name"], value["path"], base)
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=DIR (or a JSON object), got {text!r}")
    return LoRAModule(name.strip(), path.strip())


@dataclass(frozen=True, slots=True)
class ServedAdapter:
    request: LoRARequest
    info: LoRAAdapterInfo
    parent: str  # the base model's served name (what /v1/models gives as `parent`)

    @property
    def name(self) -> str:
        return self.request.lora_name


@dataclass(slots=True)
class AdapterRegistry:
    """Name -> adapter, the ids handed out, and which engine requests run under which adapter
    (so an unloaded adapter leaves the engine once its last request ends)."""

    base_name: str  # the served name of the base model
    reserved: frozenset[str]  # names adapters may not take (the base model's names)
    enabled: bool = False  # the engine was started with enable_lora
    max_lora_rank: int = 64
    adapters: dict[str, ServedAdapter] = field(default_factory=dict)
    next_id: int = 1
    loading: set[str] = field(default_factory=set)  # names being loaded right now
    running: dict[str, int] = field(default_factory=dict)  # engine request id -> adapter id
    unloaded: set[int] = field(default_factory=set)  # ids unloaded with requests still running

    def get(self, name: str) -> LoRARequest | None:
        adapter = self.adapters.get(name)
        return adapter.request if adapter is not None else None

    def served(self) -> list[ServedAdapter]:
        return list(self.adapters.values())

    def check_name(self, name: str) -> None:
        """ValueError unless an adapter may take `name`."""
        if not self.enabled:
            raise ValueError("LoRA is off: start the server with --enable-lora")
        if not name or not name.strip():
            raise ValueError("the adapter's name must not be empty")
        if {name, name.removesuffix(":latest")} & {*self.reserved, self.base_name}:  # Ollama's tag
            raise ValueError(f"the name {name!r} is the base model's; give the adapter another")
        if name in self.adapters or name in self.loading:
            raise ValueError(f"The lora adapter '{name}' has already been loaded.")

    def check_new(self, name: str, path: str) -> LoRAAdapterInfo:
        """ValueError unless an adapter may be added as `name` from `path` (the folder read
        and checked: a PEFT LoRA adapter, its rank within max_lora_rank)."""
        self.check_name(name)
        try:
            info = read_adapter_info(path)
        except OSError as exc:  # a name too long for the file system, a folder not readable
            raise ValueError(f"cannot read LoRA adapter folder {path[:200]!r}: "
                             f"{exc.strerror or exc}") from None
        if info.rank > self.max_lora_rank:
            raise ValueError(f"LoRA adapter {path!r} has rank {info.rank}, above max_lora_rank "
                             f"{self.max_lora_rank} (raise --max-lora-rank)")
        return info

    def new_request(self, name: str, info: LoRAAdapterInfo) -> LoRARequest:
        """The adapter's LoRARequest under a new id (ids are never reused, even when a load
        fails)."""
        lora = LoRARequest(name, self.next_id, info.path)
        self.next_id += 1
        return lora

    def add(self, lora: LoRARequest, info: LoRAAdapterInfo) -> ServedAdapter:
        adapter = ServedAdapter(lora, info, self.base_name)
        self.adapters[lora.lora_name] = adapter
        return adapter

    def remove(self, name: str) -> tuple[LoRARequest, bool]:
        """Take the name away; the adapter and whether the engine may drop it now (False: its
        requests still run, and `observe_output` returns its id when the last one ends)."""
        adapter = self.adapters.pop(name)
        busy = adapter.request.lora_int_id in self.running.values()
        if busy:
            self.unloaded.add(adapter.request.lora_int_id)
        return adapter.request, not busy

    def track(self, request_id: str, params: SamplingParams, lora: LoRARequest) -> list[str]:
        """Note an API request's engine requests (one per choice) as running under `lora`;
        their ids (to `untrack` if the engine refuses them)."""
        child_ids = ParentRequest.of(request_id, params).child_ids
        for child_id in child_ids:
            self.running[child_id] = lora.lora_int_id
        return child_ids

    def untrack(self, engine_request_ids: list[str]) -> list[int]:
        """Forget engine requests (finished or refused); the unloaded adapter ids now idle."""
        idle = []
        for request_id in engine_request_ids:
            lora_id = self.running.pop(request_id, None)
            if lora_id in self.unloaded and lora_id not in self.running.values():
                self.unloaded.discard(lora_id)
                idle.append(lora_id)
        return idle

    def observe_output(self, output: RequestOutput) -> list[int]:
        """An output listener's half: the unloaded adapters whose last request just ended."""
        if not output.finished or output.request_id not in self.running:
            return []
        return self.untrack([output.request_id])

    def lora_name_of(self, engine_request_id: str) -> str | None:
        """The adapter an engine request runs under, by the ids handed out here."""
        lora_id = self.running.get(engine_request_id)
        if lora_id is None:
            return None
        return next((a.name for a in self.adapters.values() if a.request.lora_int_id == lora_id),
                    None)


def registry_from_modules(modules: list[LoRAModule], *, base_name: str, reserved: frozenset[str],
                          enabled: bool, max_lora_rank: int) -> AdapterRegistry:
    """The registry with the `--lora-modules` adapters, each folder read and checked now, so
    a bad one stops the server before it serves (ValueError naming the adapter)."""
    registry = AdapterRegistry(base_name, reserved, enabled, max_lora_rank)
    if modules and not enabled:
        raise ValueError("--lora-modules needs --enable-lora")
    for module in modules:
        try:
            info = registry.check_new(module.name, module.path)
        except ValueError as exc:
            raise ValueError(f"--lora-modules {module.name}={module.path}: {exc}") from None
        if module.base_model_name is not None and module.base_model_name not in \
                {base_name, *reserved}:
            raise ValueError(f"--lora-modules {module.name}: base_model_name "
                             f"{module.base_model_name!r} is not the served model ({base_name!r})")
        registry.add(registry.new_request(module.name, info), info)
    return registry
