"""What the TUI needs from an engine client (engine.api.async_llm.AsyncLLM satisfies it).

The TUI is written against this protocol so it runs against the real client (engine in a
background process) or the deterministic fake in tests/tui, and so that importing the TUI
does not import torch: the real client is imported lazily in `tui.launch.run_tui`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvdeck.engine.types.outputs import RequestOutput
    from kvdeck.engine.types.sampling_params import SamplingParams
    from kvdeck.engine.types.stats import EngineStats


class StartupProgressLike(Protocol):
    stage: str  # "starting" | "loading" | "profiling" | "capturing" | "ready"
    message: str


class EngineHealthLike(Protocol):
    status: str  # "starting" | "ready" | "dead" | "stopped"
    detail: str


class EngineClientProtocol(Protocol):
    model_name: str
    max_model_len: int
    num_blocks: int  # KV blocks in the pool (known once started)
    model_dir: Path | None  # the model's directory (known once started)
    tokenizer: Any  # needs .vocab_size for the load generator

    async def start(
        self, on_progress: Callable[[StartupProgressLike], None] | None = None
    ) -> None: ...

    def generate(
        self,
        prompt: str | list[int] | None,
        params: SamplingParams,
        request_id: str | None = None,
        messages: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> AsyncIterator[RequestOutput]: ...

    def encode(self, prompt: str | list[int] | None = None,
               messages: list[dict] | None = None,
               chat_template_kwargs: dict | None = None) -> tuple[str | None, list[int]]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats_stream(self) -> AsyncIterator[EngineStats]: ...

    def health(self) -> EngineHealthLike: ...

    async def restart(self) -> None: ...

    async def shutdown(self) -> None: ...


class MetricsSource(Protocol):
    """An attached server that only has /metrics (vLLM): what the dashboard reads instead
    of engine snapshots (kvdeck.app.attach.remote_client.RemoteClient)."""

    kind: str  # "openai"

    def metrics_stream(self) -> AsyncIterator[Any]: ...  # MetricsView summaries


# Stages of start-up in the order the client reports them (drives the progress bar).
STARTUP_STAGES: tuple[str, ...] = ("starting", "loading", "profiling", "capturing", "ready")

ClientFactory = Callable[[], EngineClientProtocol]
