"""EngineCore: scheduler + block manager + model runner, in token ids only.

Runs in-process for the offline `LLM`, or in its own process behind the async client.
"""

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.loader import resolve_model_path
from engine.model_config import ModelConfig, read_model_config
from engine.model_runner import ModelRunner, ProgressCallback
from engine.outputs import Logprob, RequestMetrics
from engine.parallel_sampling import require_one_choice
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledBatch, Scheduler
from engine.stats import EngineStats, RequestStats

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepTimings:
    """Where step time goes: host work (schedule, prepare, update) vs the model + sampler."""

    steps: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    model_s: float = 0.0
    update_s: float = 0.0

    def add(self, schedule: float, prepare: float, model: float, update: float) -> None:
        self.steps += 1
        self.schedule_s += schedule
        self.prepare_s += prepare
        self.model_s += model
        self.update_s += update

    @property
    def host_share(self) -> float:
        host = self.schedule_s + self.prepare_s + self.update_s
        total = host + self.model_s
        return host / total if total else 0.0


@dataclass(slots=True)
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.time)
    eos_token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    new_logprobs: list[dict[int, Logprob]] | None = None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineCore:
    def __init__(self, config: EngineConfig, progress: ProgressCallback | None = None) -> None:
        progress = progress or (lambda stage, message: None)
        self.config = config
        self.model_dir = resolve_model_path(config.model)
        self.model_config = read_model_config(self.model_dir)
        self._resolve_quantization()
        self.runner = ModelRunner(config, self.model_config, self.model_dir, progress)
        num_blocks = self.runner.determine_num_blocks(progress)
        self.max_model_len = self._resolve_max_model_len(num_blocks)
        self.runner.allocate_kv_cache(num_blocks)
        if self.runner.cuda_graphs_supported and not config.enforce_eager:
            self.runner.capture_decode_graphs(self.max_model_len, progress)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.batched_token_budget,
            self.max_model_len,
        )
        self.default_eos_token_ids = set(self.model_config.eos_token_ids) | _generation_eos(self.model_dir)
        self.requests: dict[str, Request] = {}
        self.finish_counts: Counter[str] = Counter()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_steps = 0
        self.last_step = (0, 0, 0, 0.0)  # prefill tokens, decode tokens, seqs, seconds
        self.blocks_written_last_step: list[int] = []
        self.timings = StepTimings()
        logger.info("KV cache: %d blocks of %d tokens", num_blocks, config.block_size)
        progress("ready", f"{num_blocks} KV blocks of {config.block_size} tokens")

    def _resolve_quantization(self) -> None:
        quant = self.model_config.quantization_config
        method = (quant or {}).get("quant_method")
        if method == "awq":
            if self.config.quantization not in (None, "awq"):
                raise ValueError(
                    f"the checkpoint is AWQ-quantised; quantization={self.config.quantization!r} "
                    "cannot be applied on top"
                )
            self.config.quantization = "awq"
        elif method is not None:
            raise ValueError(f"checkpoint quantisation {method!r} is not supported (supported: awq)")
        elif self.config.quantization == "awq" and self.config.load_format != "dummy":
            raise ValueError(
                "quantization='awq' needs an AWQ checkpoint; quantise this model first with "
                "`kvdeck quantize MODEL --method awq`"
            )

    def _resolve_max_model_len(self, num_blocks: int) -> int:
        capacity = num_blocks * self.config.block_size
        limit = self.model_config.max_position_embeddings
        window = self.model_config.sliding_window
        asked = self.config.max_model_len
        if asked is not None:
            if asked > limit:
                raise ValueError(
                    f"max_model_len {asked} exceeds the model's max_position_embeddings {limit}"
                )
            if window is not None and asked > window:
                raise ValueError(
                    f"max_model_len {asked} exceeds the model's sliding window of {window} tokens; "
                    "kvdeck attends to the whole context, which matches the model only within "
                    "its window"
                )
            if asked > capacity:
                raise ValueError(
                    f"max_model_len {asked} does not fit in the KV cache ({num_blocks} blocks of "
                    f"{self.config.block_size} = {capacity} tokens); raise the KV memory or lower it"
                )
            return asked
        if window is not None and window < min(limit, capacity):
            logger.info("max_model_len capped at the model's sliding window (%d tokens)", window)
            return window
        return min(limit, capacity)

    # ---- the step API ------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        """Validate and queue; on error nothing changes."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        ids = request.prompt_token_ids
        if not ids:
            raise ValueError("prompt must not be empty")
        vocab = self.model_config.vocab_size
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}, which must "
                "leave room for at least one generated token"
            )
        params = request.params
        params.validate()
        require_one_choice(params)
        if any(t >= vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be in [0, {vocab})")
        core_request = Request(
            request_id=request.request_id,
            prompt_token_ids=list(ids),
            params=params,
            eos_token_ids=self.default_eos_token_ids | set(request.eos_token_ids),
            arrival_time=request.arrival_time,
        )
        self.requests[request.request_id] = core_request
        self.scheduler.add_request(core_request)

    def abort_requests(self, request_ids: list[str], status=RequestStatus.FINISHED_ABORTED) -> None:
        finished = self.scheduler.finish_requests(set(request_ids), status)
        for request in finished:
            self._forget(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        started = time.perf_counter()
        batch = self.scheduler.schedule()
        if batch.empty:
            return []
        scheduled = time.perf_counter()
        results = self.runner.execute(batch)
        executed = time.perf_counter()
        sampled = [r.token_id if r is not None else None for r in results]
        self.blocks_written_last_step = _blocks_written(batch, self.config.block_size)
        finished = self.scheduler.update_from_output(batch, sampled)
        self.num_steps += 1
        self.last_step = (batch.num_prefill_tokens, batch.num_decode_tokens, len(batch.requests),
                          self.runner.last_step_duration)
        outputs = []
        for request, result in zip(batch.requests, results):
            if result is None:
                continue
            self.generation_tokens_total += 1
            outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[result.token_id],
                    finish_reason=request.status.value if request.status.finished else None,
                    stop_reason=request.stop_reason,
                    new_logprobs=[result.logprobs] if result.logprobs is not None else None,
                    metrics=request.metrics,
                    num_cached_tokens=request.num_cached_tokens,
                )
            )
        for request in finished:
            self._forget(request)
        self.timings.add(
            schedule=scheduled - started,
            prepare=self.runner.last_prepare_duration,
            model=executed - scheduled - self.runner.last_prepare_duration,
            update=time.perf_counter() - executed,
        )
        return outputs

    def _forget(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        self.runner.sampler.forget(request.request_id)
        self.finish_counts[request.status.value] += 1
        self.prompt_tokens_total += request.num_prompt_tokens

    # ---- observability -----------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        sched = self.scheduler
        requests = [_request_stats(r) for r in sched.running]
        requests += [_request_stats(r) for r in sched.waiting]
        prefill, decode, seqs, seconds = self.last_step
        return EngineStats(
            timestamp=time.time(),
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            num_preempted=sum(1 for r in sched.waiting if r.status is RequestStatus.PREEMPTED),
            kv_cache_usage=bm.usage,
            num_blocks=bm.num_blocks,
            block_size=bm.block_size,
            num_free_blocks=bm.num_free_blocks,
            num_cached_blocks=bm.num_cached_free_blocks,
            block_ref_counts=[b.ref_count for b in bm.blocks],
            block_is_cached=[b.hash is not None for b in bm.blocks],
            blocks_written_last_step=list(self.blocks_written_last_step),
            requests=requests,
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            num_preemptions=sched.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_requests_finished=sum(self.finish_counts.values()),
            num_steps=self.num_steps,
            last_step_prefill_tokens=prefill,
            last_step_decode_tokens=decode,
            last_step_num_seqs=seqs,
            last_step_duration_s=seconds,
            finished_reasons=dict(self.finish_counts),
        )


def _request_stats(request: Request) -> RequestStats:
    if request.status is RequestStatus.RUNNING:
        state = "prefilling" if request.is_prefilling else "decoding"
    else:
        state = request.status.value
    return RequestStats(
        request_id=request.request_id,
        state=state,
        num_prompt_tokens=request.num_prompt_tokens,
        num_computed_tokens=request.num_computed_tokens,
        num_output_tokens=request.num_output_tokens,
        block_table=list(request.block_table),
        num_cached_tokens=request.num_cached_tokens,
    )


def _blocks_written(batch: ScheduledBatch, block_size: int) -> list[int]:
    """Physical blocks that receive this step's new K/V (read before counters advance)."""
    written: set[int] = set()
    for request, num_new in zip(batch.requests, batch.num_new_tokens):
        first = request.num_computed_tokens // block_size
        last = (request.num_computed_tokens + num_new - 1) // block_size
        written.update(request.block_table[first : last + 1])
    return sorted(written)


def _generation_eos(model_dir: Path) -> set[int]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return set()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except json.JSONDecodeError:
        return set()
    if isinstance(eos, int):
        return {eos}
    return set(eos or [])


__all__ = ["EngineCore", "EngineCoreOutput", "EngineCoreRequest", "ModelConfig"]
