"""EngineCore: scheduler + block manager + model runner, in token ids only.

Driven in-process by the offline `LLM` (`kvdeck.engine.core_client.inproc`), or by the loop in
its own process (`kvdeck.engine.core.loop`) behind the subprocess client. It runs one
choice per request (the front-end sends a request's n choices as n requests). It never
changes the config it is given: what it resolves (the quantisation a checkpoint implies)
lives in its own copy.
"""

import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.checkpoint_quantization import with_checkpoint_quantization
from kvdeck.engine.core.kv_tiers_setup import build_kv_tiers
from kvdeck.engine.core.lora_admission import LoRAAdmission, check_id_free
from kvdeck.engine.core.pipeline import StepPipeline
from kvdeck.engine.core.request import Request, RequestStatus, token_output
from kvdeck.engine.core.request_reason import add_extras
from kvdeck.engine.core.scheduler import ScheduledBatch, Scheduler
from kvdeck.engine.core.spec.setup import SpeculativeSetup
from kvdeck.engine.core.stats_snapshot import engine_stats
from kvdeck.engine.core.swap import build_swap_space
from kvdeck.engine.runner.batch import TokenMasks
from kvdeck.engine.runner.model_runner import ModelRunner, ProgressCallback
from kvdeck.engine.runner.step_state import KVCachePlan, StepResult
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.kv_groups import KVCacheGroup, peak_blocks
from kvdeck.engine.types.lora import LoRARequest, check_lora_request
from kvdeck.engine.types.model_config import ModelConfig, read_model_config
from kvdeck.engine.types.model_path import resolve_model_path
from kvdeck.engine.types.request_limits import RequestLimits
from kvdeck.engine.types.stats import EngineStats, KVOccupancy, StepSummary, StepTimings
from kvdeck.engine.types.wire import EngineCoreOutput, EngineCoreRequest, EngineInfo

if TYPE_CHECKING:
    from kvdeck.engine.grammar.matchers import GrammarManager
    from kvdeck.engine.runner.lora.manager import LoRAManager

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, progress: ProgressCallback | None = None) -> None:
        progress = progress or (lambda stage, message: None)
        self.model_dir = resolve_model_path(config.model)
        self.model_config = read_model_config(self.model_dir)
        self.config = with_checkpoint_quantization(config, self.model_config)
        self.runner = ModelRunner(self.config, self.model_config, self.model_dir, progress)
        # Speculative decoding: a draft model loads before the pool is sized, and shares it.
        speculation = SpeculativeSetup(self.config, self.model_dir, self.model_config, progress)
        plan = speculation.share_kv_plan(self.runner.plan_kv_cache(progress))
        self.kv_groups = self.runner.kv_pool.groups
        self.max_model_len = speculation.cap_max_model_len(
            _resolve_max_model_len(self.config, self.model_config, plan, self.kv_groups,
                                   self.runner.token_budget),
            self.config.max_model_len)
        self.runner.allocate_kv_cache(plan.num_blocks)
        if self.runner.cuda_graphs_supported and not self.config.enforce_eager:
            self.runner.capture_decode_graphs(self.max_model_len, progress,
                                              max_rows=speculation.max_decode_rows(self.config.max_num_seqs))
        elif self.config.compile_decode and not self.config.enforce_eager:
            self.runner.compile_decode(self.max_model_len)
        if self.runner.device.type == "cuda":  # no Triton compile may wait until serving
            progress("capturing", "warming up: compiling every kernel variant serving can launch")
            self.runner.warm_up(self.max_model_len)
        self.kv_plan = plan
        self.block_manager = BlockManager(plan.num_blocks, plan.block_size,
                                          self.config.enable_prefix_caching,
                                          [group.window for group in self.kv_groups], track_changes=True)
        # The prefix cache's host / disk tiers (kv_tiers.py); None unless asked for.
        self.kv_tiers = build_kv_tiers(self.config, self.runner, self.model_dir, self.block_manager)
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs,
                                   self.runner.token_budget, self.max_model_len,
                                   self.model_config.long_rope_from,
                                   speculative=speculation.enabled,
                                   swap=build_swap_space(self.config, self.runner, self.block_manager))
        if self.config.enable_lora:  # a step holds at most max_loras adapters (the runner's slots)
            self.scheduler.lora_admission = LoRAAdmission(self.config.max_loras)
        eos = set(self.model_config.eos_token_ids) | _generation_eos(self.model_dir)
        self.default_eos_token_ids = eos
        self.limits = RequestLimits(self.max_model_len, self.model_config.vocab_size)
        self.spec = speculation.build_decoder(plan, self.max_model_len, self.runner.decoder_stack_rows())
        self._grammars: GrammarManager | None = None  # built with the first structured request
        self.requests: dict[str, Request] = {}
        self._needs_host_tokens: set[str] = set()  # grammars, penalties: no async step with them
        async_scheduling = self.config.async_scheduling
        if async_scheduling is None:
            async_scheduling = self.runner.device.type == "cuda"
        self.pipeline = StepPipeline(self) if async_scheduling else None
        self.finish_counts: Counter[str] = Counter()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_steps = 0
        self.last_step = StepSummary()
        self.timings = StepTimings()
        logger.info("KV cache: %d blocks of %d tokens (%s)", plan.num_blocks, plan.block_size,
                    plan.sized_by)
        progress("ready", f"{plan.num_blocks} KV blocks of {plan.block_size} tokens")

    @property
    def info(self) -> EngineInfo:
        runner = self.runner
        return EngineInfo(
            model_dir=str(self.model_dir),
            max_model_len=self.max_model_len,
            vocab_size=self.model_config.vocab_size,
            num_blocks=self.kv_plan.num_blocks,
            block_size=self.kv_plan.block_size,
            device=str(runner.device),
            dtype=str(runner.dtype).removeprefix("torch."),
            kv_bytes_per_token=self.kv_plan.bytes_per_token,
            kv_cache_dtype=runner.kv_pool.format.name,
            enable_prefix_caching=self.config.enable_prefix_caching,
            weight_bytes_per_token=runner.weight_bytes_per_token(),
            cuda_graphs=runner.decode_graphs is not None and runner.device.type == "cuda",
            kv_bytes_per_block=self.kv_plan.bytes_per_block,
            kv_cache_tokens=self.kv_plan.num_tokens,
            hidden_size=self.model_config.hidden_size,
            kv_group_windows=[group.window for group in self.kv_groups],
            kv_group_layers=[list(group.layers) for group in self.kv_groups],
            fallbacks=runner.fallbacks(),
        )

    # ---- the step API ------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        """Check and queue; ValueError (and nothing changes) for a request the engine cannot
        run. The front-end makes the same checks first; these keep the core safe from any
        client."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.limits.check(request.prompt_token_ids, request.params)
        if request.params.n != 1:
            raise ValueError(f"n={request.params.n}: the core runs one choice per request; the "
                             "front-end sends a request's choices as requests of their own")
        if request.lora_request is not None:  # checked and loaded to the host now, not in a step
            check_lora_request(request.lora_request, self.config.enable_lora)
            check_id_free(request.lora_request, self.requests.values())
            self._lora().add(request.lora_request)
        core_request = Request(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            params=request.params,
            eos_token_ids=self.default_eos_token_ids | set(request.eos_token_ids),
            arrival_time=request.arrival_time,
            lora_request=request.lora_request,
        )
        if request.params.structured_outputs is not None:
            core_request.grammar = self._grammar_manager().start(request.params.structured_outputs)
        params = request.params
        # Prompt logprobs come from the synchronous step's forward (ModelRunner.execute).
        if (params.structured_outputs is not None or params.has_penalties
                or params.prompt_logprobs is not None or params.embed):
            self._needs_host_tokens.add(request.request_id)
        self.requests[request.request_id] = core_request
        self.scheduler.add_request(core_request)

    # ---- LoRA adapters (vLLM's names) ---------------------------------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check and load an adapter's host copy; False if it is held already. ValueError,
        nothing loaded, for a bad one (or with LoRA off)."""
        check_lora_request(lora_request, self.config.enable_lora)
        return self._lora().add(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop an adapter's copies (requests still using it reload it from its folder)."""
        if not self.config.enable_lora:
            return False
        return self._lora().remove(lora_int_id)

    def list_loras(self) -> list[int]:
        return self._lora().list() if self.config.enable_lora else []

    def _lora(self) -> "LoRAManager":
        return self.runner.lora  # set whenever enable_lora is (check_lora_request ran first)

    def call_utility(self, method: str, args: tuple) -> object:
        """A client's UtilityCall (engine/types/wire.py), by name."""
        match method:
            case "add_lora":
                return self.add_lora(*args)
            case "remove_lora":
                return self.remove_lora(*args)
            case "list_loras":
                return self.list_loras()
        raise ValueError(f"unknown engine method {method!r}")

    def _grammar_manager(self) -> "GrammarManager":
        if self._grammars is None:
            # Imported here: the grammar library is needed only once a request asks for it.
            from kvdeck.engine.grammar.matchers import GrammarManager

            source = self.config.tokenizer or str(self.model_dir)
            self._grammars = GrammarManager(source, self.model_config.vocab_size,
                                            sorted(self.default_eos_token_ids))
        return self._grammars

    def abort_requests(self, request_ids: list[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        for request in self.scheduler.finish_requests(set(request_ids), status):
            self._forget(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self.step_in_flight

    def step(self) -> list[EngineCoreOutput]:
        """One step's outputs; with async scheduling, the previous step's (pipeline.py)."""
        outputs = self.pipeline.step() if self.pipeline is not None else self.step_sync()
        if self.kv_tiers is not None:  # the blocks cached in this step go to the disk tier's writer
            self.kv_tiers.store_registered(self.runner.kv_tier_io.gather_bytes)
        return outputs

    @property
    def step_in_flight(self) -> bool:
        return self.pipeline is not None and self.pipeline.busy

    def pipelinable(self) -> bool:
        """Whether the next step may be scheduled before this one's samples are on the host:
        not with drafts, grammars or penalties about (they need the tokens there)."""
        return self.spec is None and not self._needs_host_tokens

    def step_sync(self) -> list[EngineCoreOutput]:
        started = time.perf_counter()
        failed_grammars = self._fail_uncompiled_grammars()
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        if batch.empty:
            return failed_grammars
        if self.spec is not None:
            self.spec.discard(batch.preempted)
        scheduled = time.perf_counter()
        result = self.runner.execute(batch, self._token_masks(batch),
                                     self.spec.draft_probs() if self.spec is not None else None)
        executed = time.perf_counter()
        for index, (start, entries) in result.prompt_logprobs.items():
            batch.requests[index].add_prompt_logprobs(start, entries)
        for index, embedding in result.embeddings.items():
            batch.requests[index].embedding = embedding
        if self.scheduler.swap is not None:  # the copies' times, into the timings and timelines
            self.scheduler.swap.collect(batch.step, self.runner.kv_swap, self.timings)
        if self.spec is None and not result.spec_samples:
            outputs, finished = self._update_single(batch, result)
        else:
            outputs, finished = self._update_runs(batch, result)
        self.num_steps += 1
        self.last_step = StepSummary(batch.num_prefill_tokens, batch.num_decode_tokens,
                                     len(batch.requests), result.total_s)
        outputs = failed_grammars + self._fail(batch, result.failures) + outputs
        for request in finished:
            self._forget(request)
        finished_at = time.perf_counter()
        self.timings.add(schedule=scheduled - started, prepare=result.prepare_s,
                         model=executed - scheduled - result.prepare_s, update=finished_at - executed)
        if self.spec is not None:
            self.spec.observe_step(batch.num_prefill_tokens, batch.num_decode_tokens,
                                   finished_at - started)
        return outputs

    def _update_single(self, batch: ScheduledBatch, result: StepResult,
                       ) -> tuple[list[EngineCoreOutput], list[Request]]:
        """The scheduler's update and the outputs, when each row emitted at most one token (no
        speculation): the common step, kept free of per-row lists."""
        samples = result.samples
        sampled = [None if s is None else s.token_id for s in samples]
        grammar_done = self._advance_grammars(batch, [None if t is None else [t] for t in sampled]) \
            if self._grammars is not None else []
        finished = self.scheduler.update_from_output(batch, sampled)
        finished += self._finish_grammars(grammar_done)
        outputs = []
        for request, sample in zip(batch.requests, samples):
            if sample is not None:
                outputs.append(token_output(request, [sample]))
        self.generation_tokens_total += len(outputs)
        return outputs, finished

    def _update_runs(self, batch: ScheduledBatch, result: StepResult,
                     ) -> tuple[list[EngineCoreOutput], list[Request]]:
        """The scheduler's update and the outputs when rows may emit runs (speculation)."""
        # Per request: what it emitted (a verified speculative run, or one sample), or None.
        emitted = [result.spec_samples.get(i, [s] if s is not None else None)
                   for i, s in enumerate(result.samples)]
        if self.spec is not None:
            self.spec.account(batch.requests, emitted)
        sampled = [None if e is None else [s.token_id for s in e] for e in emitted]
        grammar_done = self._advance_grammars(batch, sampled)
        outputs_before = [r.num_output_tokens for r in batch.requests]
        finished = self.scheduler.update_from_output(batch, sampled)
        if self.spec is not None:
            self.spec.after_update(self.scheduler.rolled_back_blocks)
        finished += self._finish_grammars(grammar_done)
        outputs = []
        for request, samples, before in zip(batch.requests, emitted, outputs_before):
            if samples is None:
                continue
            kept = samples[: request.num_output_tokens - before]  # a stop drops the rest of a run
            self.generation_tokens_total += len(kept)
            outputs.append(token_output(request, kept))
        return outputs, finished

    def _finish_grammars(self, grammar_done: list[Request]) -> list[Request]:
        """Requests whose grammar is complete stop: nothing else may follow."""
        finished = []
        for request in grammar_done:
            if not request.status.finished:
                finished += self.scheduler.finish_requests({request.request_id},
                                                           RequestStatus.FINISHED_STOPPED)
        return finished

    def _token_masks(self, batch: ScheduledBatch) -> TokenMasks | None:
        """Bitmask rows for the constrained requests that sample this step."""
        if self._grammars is None:  # no request has asked for a grammar yet
            return None
        rows = [i for i, (request, num_new) in enumerate(zip(batch.requests, batch.num_new_tokens))
                if request.grammar is not None
                and request.num_computed_tokens + num_new == request.num_tokens]
        if not rows:
            return None
        states = [batch.requests[i].grammar for i in rows]
        return TokenMasks(rows, self._grammar_manager().fill_bitmask(states))

    def _advance_grammars(self, batch: ScheduledBatch, sampled: list[list[int] | None]) -> list[Request]:
        """Feed sampled tokens to their matchers; the requests whose grammar is complete.
        (A constrained request never speculates: one token a step.)"""
        done = []
        for request, tokens in zip(batch.requests, sampled):
            if request.grammar is not None and tokens is not None:
                request.metrics.grammar_compile_s = request.grammar.compile_s
                if any(self._grammar_manager().accept(request.grammar, t) for t in tokens):
                    done.append(request)
        return done

    def _fail_uncompiled_grammars(self) -> list[EngineCoreOutput]:
        """Waiting requests whose grammar failed to compile end with an error."""
        if self._grammars is None:
            return []
        broken = {r.request_id: r.grammar.error for r in self.scheduler.waiting
                  if r.grammar is not None and r.grammar.error is not None}
        outputs = []
        for request in self.scheduler.finish_requests(set(broken), RequestStatus.FINISHED_ERROR):
            self._forget(request)
            outputs.append(EngineCoreOutput(request.request_id, [], RequestStatus.FINISHED_ERROR.value,
                                            metrics=request.metrics, error=broken[request.request_id]))
        return outputs

    def _fail(self, batch: ScheduledBatch, failures: dict[int, str]) -> list[EngineCoreOutput]:
        """Finish the requests whose processing failed this step (their blocks freed, their
        client told why); the rest of the batch goes on."""
        outputs = []
        for row, why in failures.items():
            request = batch.requests[row]
            for failed in self.scheduler.finish_requests({request.request_id},
                                                         RequestStatus.FINISHED_ERROR):
                self._forget(failed)
            logger.error("request %s failed and was finished: %s", request.request_id, why)
            outputs.append(EngineCoreOutput(request.request_id, [], RequestStatus.FINISHED_ERROR.value,
                                            metrics=request.metrics, error=why))
        return outputs

    def _forget(self, request: Request) -> None:
        if request.metrics.timeline is not None:  # its final output's: what only the core knew
            add_extras(request.metrics.timeline,
                       self.spec.request_stats(request.request_id) if self.spec is not None else None,
                       request.grammar.compile_s if request.grammar is not None else None)
        self.requests.pop(request.request_id, None)
        self._needs_host_tokens.discard(request.request_id)
        self.runner.forget(request.request_id)
        if self.kv_tiers is not None:
            self.kv_tiers.forget(request.request_id)
        if self.spec is not None:
            self.spec.forget(request.request_id)
        self.finish_counts[request.status.value] += 1
        self.prompt_tokens_total += request.num_prompt_tokens

    # ---- for benchmarks and tests ---------------------------------------------------
    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix and earlier requests' outputs kept for drafting (suffix
        decoding's): nothing from an earlier run is reused."""
        self.block_manager.reset_prefix_cache()
        if self.spec is not None:
            self.spec.reset_cache()

    def reset_timings(self) -> None:
        self.timings = StepTimings()

    def shutdown(self) -> None:
        """Release the model and the KV pool now (idempotent)."""
        if self.kv_tiers is not None:  # the disk tier's queued writes reach the disk first
            self.kv_tiers.close()
        self.runner.shutdown()
        if self.spec is not None:
            self.spec.shutdown()
        if self._grammars is not None:
            self._grammars.shutdown()

    # ---- observability -----------------------------------------------------------
    @property
    def blocks_written_last_step(self) -> list[int]:
        """Physical blocks that received the last step's new K/V (from its slot mapping,
        worked out only when asked: the dashboard reads it at most ~15 times a second)."""
        return self.runner.input_batch.blocks_written()

    def occupancy(self) -> KVOccupancy:
        """The running batch's hold on the pool; cheap enough to read every step (the block
        manager counts held entries as they change; only running requests hold blocks)."""
        running = self.scheduler.running
        held = self.block_manager.num_held_entries
        return KVOccupancy(
            usage=self.block_manager.usage,
            num_running=len(running),
            # Slots of held blocks, per KV group (released window blocks hold none).
            allocated_tokens=held * self.kv_plan.block_size // len(self.kv_groups),
            computed_tokens=sum(r.num_computed_tokens for r in running),
        )

    def stats(self) -> EngineStats:
        """A snapshot for the dashboard and /metrics (stats_snapshot.py)."""
        return engine_stats(self)

def _resolve_max_model_len(config: EngineConfig, model_config: ModelConfig, plan: KVCachePlan,
                           groups: list[KVCacheGroup], chunk_tokens: int) -> int:
    """The asked max_model_len, checked, or the longest the model and the pool allow. One
    request must fit in the pool alone: with sliding windows it holds only a window's
    blocks (plus a chunk's) in those groups, so a windowed model may run past the pool."""
    limit = model_config.max_position_embeddings

    def peak(num_tokens: int) -> int:
        return peak_blocks(groups, num_tokens, plan.block_size, chunk_tokens)

    asked = config.max_model_len
    if asked is not None:
        if asked > limit:
            raise ValueError(
                f"max_model_len {asked} exceeds the model's max_position_embeddings {limit}"
            )
        if peak(asked) > plan.num_blocks:
            raise ValueError(
                f"max_model_len {asked} does not fit in the KV cache ({plan.num_blocks} blocks of "
                f"{plan.block_size} tokens; one request that long holds up to {peak(asked)}); "
                "raise the KV memory or lower it"
            )
        return asked
    lo, hi = 0, limit  # the longest length whose peak fits (peak grows with the length)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if peak(mid) <= plan.num_blocks else (lo, mid - 1)
    if lo == 0:
        raise ValueError(f"the KV cache ({plan.num_blocks} blocks) cannot hold one token of this "
                         "model; raise the KV memory")
    return lo


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
