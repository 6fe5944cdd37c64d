"""Iteration-level scheduling: which requests run this step, and how many tokens each.

Each step fills a token budget: running decodes first (one token each), then chunks
of prefills already under way, then new requests from the queue, whose cached prefix
is reused. When the pool runs dry the newest running request is preempted: its blocks
are freed and it goes back to the front of the queue to be recomputed later, or, with
swap preemption (engine/core/swap.py), its blocks are copied to host swap space and back
when it resumes. After each step, blocks that slid out of a sliding window are released.
"""

import time
from collections import deque
from dataclasses import dataclass, field

from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.lora_admission import LoRAAdmission
from kvdeck.engine.core.request import Request, RequestStatus
from kvdeck.engine.core.swap import SwapSpace
from kvdeck.engine.runner.batch import PLACEHOLDER
from kvdeck.engine.runner.tier_transfers import TierTransfers
from kvdeck.engine.types.request_timeline import PREFILL


@dataclass(slots=True)
class ScheduledBatch:
    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    preempted: list[Request] = field(default_factory=list)
    # The first rows: decodes of one token into a slot their table already has (the runner
    # packs them without looking at each); filled by `plain` while scheduling.
    num_plain_decodes: int = 0
    plain: list[Request] = field(default_factory=list)
    # The requests whose block tables changed since the last batch (the block manager's
    # list): the runner's persistent rows look at these only. None: look at every row.
    changed_tables: list[Request] | None = None
    step: int = 0  # the scheduler's count of schedules when it was made (request timelines)
    # The prefix cache's host / disk tiers (engine/core/kv_tiers.py): blocks to save to the host
    # tier and lower-tier hits to copy in, before this step's forward. None: no tiers.
    tier_transfers: TierTransfers | None = None
    # Swap preemption (engine/core/swap.py): (device block, host slot) pairs to copy out and
    # (host slot, device block) pairs to copy in, both before this step's forward.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.requests

    def add(self, request: Request, num_tokens: int) -> None:
        if request.is_prefilling:
            self.num_prefill_tokens += num_tokens
        else:
            self.num_decode_tokens += num_tokens
        self.requests.append(request)
        self.num_new_tokens.append(num_tokens)

    def holds(self, request: Request) -> bool:
        return request in self.requests or request in self.plain

    def remove(self, request: Request) -> int:
        if request in self.plain:  # counted in num_decode_tokens by put_plain_first
            self.plain.remove(request)
            return 1
        i = self.requests.index(request)
        n = self.num_new_tokens.pop(i)
        self.requests.pop(i)
        if request.is_prefilling:
            self.num_prefill_tokens -= n
        else:
            self.num_decode_tokens -= n
        return n

    def put_plain_first(self) -> None:
        """The plain decodes become the first rows (scheduling decided in running order)."""
        self.num_plain_decodes = len(self.plain)
        self.num_decode_tokens += len(self.plain)
        self.requests = self.plain + self.requests
        self.num_new_tokens = [1] * len(self.plain) + self.num_new_tokens
        self.plain = []


class Scheduler:
    lora_admission: LoRAAdmission | None = None  # multi-LoRA: set by the engine with enable_lora
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        long_rope_from: int | None = None,
        speculative: bool = True,
        swap: SwapSpace | None = None,
    ) -> None:
        """`speculative`: requests may carry drafts (False: their spec_token_ids stay empty,
        and the hot loop never looks)."""
        self.block_manager = block_manager
        self.swap = swap  # None: preemption always recomputes
        self.speculative = speculative
        self.long_rope_from = long_rope_from  # LongRoPE models: ModelConfig.long_rope_from
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_schedules = 0  # the "step" of request timelines
        self.rolled_back_blocks: list[int] = []  # blocks the last update gave back (rejected drafts)

    def add_request(self, request: Request) -> None:
        params = request.params
        request.stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else frozenset(request.eos_token_ids))
        request.length_limit = min(self.max_model_len - request.num_prompt_tokens,
                                   params.max_tokens if params.max_tokens is not None else self.max_model_len)
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ------------------------------------------------------------------
    def schedule(self, pipelined: bool = False) -> ScheduledBatch:
        """The next batch. `pipelined` (async scheduling): the step in flight was taken as done
        (`advance_inflight`); a request whose output already reaches its length limit there
        finishes when its samples arrive, and is not scheduled again."""
        self.num_schedules += 1
        batch = ScheduledBatch(step=self.num_schedules)
        budget = self.max_num_batched_tokens
        prefills: list[Request] = []
        # A copy: scheduling a decode may preempt later requests (they are skipped).
        running = [r for r in self.running if len(r.output_token_ids) < r.length_limit] \
            if pipelined else list(self.running)
        # A plain decode: one token into a slot its table already has (block_manager.has_slot,
        # inlined for one KV group), nothing else to decide.
        single = self.block_manager.num_groups == 1 and self.long_rope_from is None
        block_size = self.block_manager.block_size
        plain = batch.plain
        running_status = RequestStatus.RUNNING
        speculative = self.speculative
        # Decodes in running order, in the one pass that tells them from prefills (which go
        # after them); a preemption changes nothing of a request not yet looked at but its
        # status.
        for request in running:
            if budget == 0:
                break
            if request.status is not running_status:
                continue  # preempted earlier in this loop
            # request.is_prefilling, inlined (every request, every step)
            output = request.output_token_ids
            if not output or len(request.prompt_token_ids) + len(output) - request.num_computed_tokens > 1:
                prefills.append(request)
            elif single and not (speculative and request.spec_token_ids) and request.block_tables \
                    and len(request.block_tables[0]) * block_size > request.num_computed_tokens:
                plain.append(request)
                budget -= 1
            else:
                budget = self._schedule_running(request, batch, budget)
        for request in prefills:
            if budget == 0:
                break
            if request.status is RequestStatus.RUNNING:  # else preempted earlier in this step
                budget = self._schedule_running(request, batch, budget)
        if not batch.preempted:
            self._admit_waiting(batch, budget)
        batch.put_plain_first()
        if batch.empty and batch.blocks_to_swap_out:
            self.swap.cancel_swap_outs(batch)  # no runner sees an empty batch to copy them
        if batch.requests and self.block_manager.tiers is not None:  # else kept for one that runs
            batch.tier_transfers = self.block_manager.tiers.take_transfers()
        if batch.requests and self.block_manager.track_changes:  # else kept for a batch that runs
            batch.changed_tables = self.block_manager.take_changed()
        return batch

    def _schedule_running(self, request: Request, batch: ScheduledBatch, budget: int) -> int:
        """Schedule a running request's next tokens, preempting the newest when blocks run
        out; the budget left."""
        self._switch_to_long_rope(request)
        num_tokens = min(request.num_tokens - request.num_computed_tokens, budget)
        # Speculative drafts ride on a decode as one chunk of 1 + k tokens, budget permitting.
        drafts = request.spec_token_ids
        request.spec_token_ids = [] if request.is_prefilling else drafts[: budget - num_tokens]
        while not self.block_manager.allocate_slots(request, num_tokens + len(request.spec_token_ids)):
            if request.spec_token_ids:  # give up the drafts before preempting anyone
                request.spec_token_ids = []
                continue
            victim = self.running[-1]
            if batch.holds(victim):
                budget += batch.remove(victim)
            self._preempt(victim, batch, "" if victim is request else request.request_id)
            if victim is request:
                return budget
        if request.is_prefilling:
            request.timeline.prefill_chunk(time.monotonic(), batch.step, num_tokens, 0,
                                           request.num_computed_tokens + num_tokens >= request.num_tokens)
        num_tokens += len(request.spec_token_ids)
        batch.add(request, num_tokens)
        return budget - num_tokens

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        now = time.time()
        compiling: list[Request] = []  # their grammars are not ready: they keep their places
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.waiting_for_grammar:
                compiling.append(self.waiting.popleft())
                continue
            if self.lora_admission is not None and not self.lora_admission.admits(request, self.running):
                compiling.append(self.waiting.popleft())  # max_loras adapters run: it keeps its place
                continue
            if request.status is RequestStatus.SWAPPED:
                resumed = self._resume_swapped(request, batch, budget)
                if resumed is None:
                    break
                budget = resumed
                continue
            self._switch_to_long_rope(request)
            cached = self.block_manager.find_cached_prefix(request)
            num_cached = cached.num_blocks * self.block_manager.block_size
            num_tokens = min(request.num_tokens - num_cached, budget)
            if not self.block_manager.allocate_slots(request, num_tokens, cached):
                break
            num_cached = cached.num_blocks * self.block_manager.block_size  # a disk read may shorten it
            if not request.needs_prompt_logprobs:  # it looked nothing up (vLLM counts none either)
                self.block_manager.record_prefix_lookup(request.num_tokens, num_cached)
            self.waiting.popleft()
            request.num_computed_tokens = num_cached
            if request.metrics.first_scheduled_time is None:
                request.num_cached_tokens = num_cached
                host = sum(1 for load in cached.loads if load.host_row >= 0)
                request.num_cached_tokens_host = host * self.block_manager.block_size
                request.num_cached_tokens_disk = (len(cached.loads) - host) * self.block_manager.block_size
                request.metrics.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            mono = time.monotonic()
            request.timeline.admitted(mono, num_cached)
            request.timeline.prefill_chunk(mono, batch.step, num_tokens, num_cached,
                                           num_cached + num_tokens >= request.num_tokens)
            self.running.append(request)
            batch.add(request, num_tokens)
            budget -= num_tokens
        self.waiting.extendleft(reversed(compiling))

    def _switch_to_long_rope(self, request: Request) -> None:
        """A request that grows past a LongRoPE model's pretraining context rotates every
        position with the long factors from then on: K/V computed with the short ones are
        dropped and recomputed in this and the next steps (transformers' Phi-3 does the same)."""
        if self.long_rope_from is None or request.long_rope:
            return
        if request.num_tokens > self.long_rope_from:
            request.long_rope = True
            self.block_manager.free(request)
            request.num_computed_tokens = 0

    def _preempt(self, request: Request, batch: ScheduledBatch, needed_by: str) -> None:
        """`needed_by`: the request whose blocks it gave up ("": its own, it was the newest)."""
        # Swapped: its blocks are copied out before this step's forward, then released here.
        swapped = self.swap.swap_out(request, batch) if self.swap is not None else 0
        request.timeline.preempted(time.monotonic(), batch.step, needed_by,
                                   len(request.output_token_ids), swapped)
        self.running.remove(request)
        if not swapped:
            self.block_manager.free(request)
            request.num_computed_tokens = 0
        request.spec_token_ids = []  # drafts are discarded with the K/V they extended
        request.status = RequestStatus.SWAPPED if swapped else RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        batch.preempted.append(request)

    def _resume_swapped(self, request: Request, batch: ScheduledBatch, budget: int) -> int | None:
        """Swap a swapped-out request back in and schedule its next tokens; the budget left, or
        None when the pool cannot take it yet."""
        num_tokens = min(request.num_tokens - request.num_computed_tokens, budget)
        if not self.swap.swap_in(request, batch, num_tokens):
            return None
        self.waiting.popleft()
        request.status = RequestStatus.RUNNING
        prefilling = request.is_prefilling
        mono = time.monotonic()
        request.timeline.resumed(mono, batch.step, len(request.output_token_ids), prefilling)
        if prefilling:
            request.timeline.prefill_chunk(mono, batch.step, num_tokens, 0,
                                           request.num_computed_tokens + num_tokens >= request.num_tokens)
        self.running.append(request)
        batch.add(request, num_tokens)
        return budget - num_tokens

    # ---- after the model ran -------------------------------------------------------
    def update_from_output(self, batch: ScheduledBatch,
                           sampled: list[int | list[int] | None]) -> list[Request]:
        """Advance each request by its scheduled tokens, append sampled tokens, finish.

        `sampled[i]` is the token sampled for batch.requests[i] (a list: the tokens a
        verified speculative chunk emitted, its accepted drafts then one more), or None when
        that request was in the middle of its prefill. Returns the requests that finished.
        """
        finished: list[Request] = []
        self.rolled_back_blocks = []
        now = time.time()
        plain = batch.num_plain_decodes
        if plain:
            self._advance_plain(batch.requests[:plain], sampled[:plain], now, finished)
        manager = self.block_manager
        caching, windowed = manager.enable_prefix_caching, manager.windowed
        check_stop = self._check_stop
        for request, num_tokens, sample in zip(batch.requests[plain:], batch.num_new_tokens[plain:],
                                               sampled[plain:]):
            num_drafts = len(request.spec_token_ids)
            if sample is None:  # mid-prefill (or its sampling failed: drafts stay unverified)
                request.num_computed_tokens += num_tokens - num_drafts
            else:
                tokens = [sample] if sample.__class__ is int else sample
                kept = 0
                for token_id in tokens:  # a stop inside an accepted run drops the tokens after it
                    request.output_token_ids.append(token_id)
                    kept += 1
                    check_stop(request, token_id)
                    if request.status.finished:
                        break
                # Verified: the old newest token and each kept draft (not the newest token).
                request.num_computed_tokens += kept if num_drafts else num_tokens
                if request.metrics.first_token_time is None:
                    request.metrics.first_token_time = now
                request.metrics.last_token_time = now
                if request.timeline.phase == PREFILL:  # its prefill (or recompute) is done
                    request.timeline.decoding(time.monotonic(), batch.step, len(request.output_token_ids))
            if num_drafts:  # blocks holding only rejected drafts go back now
                self.rolled_back_blocks += manager.free_beyond(request, request.num_computed_tokens)
                request.spec_token_ids = []
            if caching:
                manager.cache_full_blocks(request)
            if windowed:
                manager.release_out_of_window(request)
            if request.status.finished:
                finished.append(request)
        for request in finished:
            self._finish(request, now)
        return finished

    def _advance_plain(self, requests: list[Request], sampled: list[int | None], now: float,
                       finished: list[Request]) -> None:
        """update_from_output for plain decodes (one token each, no drafts), which are most rows
        of most steps: only what such a row can change is looked at."""
        manager = self.block_manager
        caching, windowed, block_size = manager.enable_prefix_caching, manager.windowed, manager.block_size
        check_stop = self._check_stop
        for request, token in zip(requests, sampled):
            if token is not None:  # None: its sampling failed (the core ends it)
                if token.__class__ is not int:  # a run of one (a speculative step's row)
                    token = token[0]
                output = request.output_token_ids
                output.append(token)
                # Only a token in stop_ids or an output length_limit long may stop it (it was
                # running when scheduled, and nothing else finishes it before this update).
                if token in request.stop_ids or len(output) >= request.length_limit:
                    check_stop(request, token)
                    if request.status.finished:
                        finished.append(request)
                metrics = request.metrics
                if metrics.first_token_time is None:
                    metrics.first_token_time = now
                metrics.last_token_time = now
            request.num_computed_tokens += 1
            if caching and request.num_computed_tokens % block_size == 0:  # a block just filled
                manager.cache_full_blocks(request)
            if windowed:
                manager.release_out_of_window(request)

    # ---- async scheduling: one step in flight (engine/core/pipeline.py) -------------------
    def advance_inflight(self, batch: ScheduledBatch) -> None:
        """Before the next schedule, take the step in flight as done: each row's tokens count as
        computed, and each row that samples holds a PLACEHOLDER for its token."""
        running = RequestStatus.RUNNING
        for request, num_tokens in zip(batch.requests, batch.num_new_tokens):
            if request.status is not running:
                continue  # finished or aborted since it was scheduled
            request.num_computed_tokens += num_tokens
            if request.num_computed_tokens == request.num_tokens:
                request.output_token_ids.append(PLACEHOLDER)

    def resolve_inflight(self, batch: ScheduledBatch, sampled: list[int | None],
                         ) -> tuple[list[Request], list[bool]]:
        """The step in flight's samples arrived: each placeholder becomes its token (a request
        that finished or was aborted meanwhile takes none), stops are checked, full blocks
        cached. The requests that finished, and which rows took their token."""
        finished: list[Request] = []
        taken: list[bool] = []
        now = time.time()
        manager = self.block_manager
        running = RequestStatus.RUNNING
        for request, sample in zip(batch.requests, sampled):
            output = request.output_token_ids
            took = (sample is not None and not request.status.finished and bool(output)
                    and output[-1] == PLACEHOLDER)
            taken.append(took)
            if took:
                output[-1] = sample
                if sample in request.stop_ids or len(output) >= request.length_limit:
                    self._check_stop(request, sample)
                if request.metrics.first_token_time is None:
                    request.metrics.first_token_time = now
                request.metrics.last_token_time = now
                if request.timeline.phase == PREFILL:
                    request.timeline.decoding(time.monotonic(), batch.step, len(output))
            if request.status is running:  # not preempted by the schedule after it
                if manager.enable_prefix_caching:
                    manager.cache_full_blocks(request)
                if manager.windowed:
                    manager.release_out_of_window(request)
            if took and request.status.finished:
                finished.append(request)
        for request in finished:
            self._finish(request, now)
        return finished, taken

    def _check_stop(self, request: Request, token_id: int) -> None:
        params = request.params
        num_output = len(request.output_token_ids)
        if num_output >= params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                return
            if params.stop_token_ids and token_id in params.stop_token_ids:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = token_id
                return
        if params.max_tokens is not None and num_output >= params.max_tokens:
            request.status = RequestStatus.FINISHED_LENGTH
        elif len(request.prompt_token_ids) + num_output >= self.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH

    def finish_requests(self, request_ids: set[str], status: RequestStatus) -> list[Request]:
        """Abort (or stop, for stop strings found client-side) requests wherever they are."""
        found = [r for r in self.running if r.request_id in request_ids]
        found += [r for r in self.waiting if r.request_id in request_ids]
        now = time.time()
        for request in found:
            request.status = status
            self._finish(request, now)
        return found

    def _finish(self, request: Request, now: float) -> None:
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.block_manager.free(request)
        if self.swap is not None:
            self.swap.forget(request)  # its host slots, if it was swapped out
        request.metrics.finished_time = now
        # Its timeline travels with its final output (the server keeps the last ones).
        timeline = request.timeline
        timeline.finished(time.monotonic(), self.num_schedules, request.status.value,
                          len(request.output_token_ids))
        request.metrics.timeline = timeline.snapshot(timeline.phases[-1][0], self.num_schedules,
                                                     len(request.output_token_ids))
