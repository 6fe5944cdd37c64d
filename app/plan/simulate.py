"""Run a workload through the engine's own Scheduler and BlockManager in simulated time.

Each step: the requests that arrived by now are added, the scheduler builds its batch
exactly as EngineCore.step_sync does, the cost model says how long the step takes, the clock
advances by that, and every row whose prefill is complete "samples" a token (random ids
from the request's own seeded generator: no model). The request runs with ignore_eos and
max_tokens = its output length, so it finishes when the real engine would. Finished turns
may bring follow-ups (the workload's next turn).
"""

import heapq
import random
import zlib
from dataclasses import dataclass, field

from kvdeck.app.plan.choices import EngineChoice
from kvdeck.app.plan.cost_model import CostModel, StepShape
from kvdeck.app.plan.workload import FIRST_TOKEN_ID, PlannedRequest, Workload
from kvdeck.engine.core.block_manager import BlockManager
from kvdeck.engine.core.request import Request
from kvdeck.engine.core.scheduler import ScheduledBatch, Scheduler
from kvdeck.engine.types.sampling_params import SamplingParams

MAX_STEPS = 5_000_000  # a workload that long is a mistake, not a plan
GIB = 2**30


@dataclass(slots=True)
class RequestResult:
    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    first_token_s: float | None = None
    finished_s: float | None = None
    token_gaps_s: list[float] = field(default_factory=list)  # between its output tokens
    last_token_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    def add_token(self, now: float) -> None:
        """An output token at `now`: the first sets TTFT, the others add a gap."""
        if self.first_token_s is None:
            self.first_token_s = now
        else:
            self.token_gaps_s.append(now - self.last_token_s)
        self.last_token_s = now


@dataclass(slots=True)
class SimResult:
    choice: EngineChoice
    requests: list[RequestResult]
    num_steps: int = 0
    peak_blocks: int = 0  # blocks held at the fullest step (cached-but-free ones are free)
    peak_blocks_after_step: int = 0  # the same after each step's update: what snapshots see
    peak_blocks_sampled: int = 0  # the fullest state at `sample_times` (a recording's snapshots)
    num_preemptions: int = 0
    max_running: int = 0
    duration_s: float = 0.0
    prompt_tokens_computed: int = 0  # prefill tokens run, recomputation included
    generated_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    swapped_blocks: int = 0  # copied out and in by swap preemption
    rejected: list[str] = field(default_factory=list)  # longer than max_model_len
    step_shapes: list[StepShape] = field(default_factory=list)  # kept when asked (tests)


def _token_source(request_id: str) -> random.Random:
    return random.Random(zlib.crc32(request_id.encode()))


def step_shape(batch: ScheduledBatch) -> StepShape:
    """The batch's demands, read before the scheduler advances it."""
    context = pairs = 0
    for request, n in zip(batch.requests, batch.num_new_tokens):
        computed = request.num_computed_tokens
        context += computed + n
        pairs += n * computed + n * (n + 1) // 2
    return StepShape(len(batch.requests), batch.num_decode_tokens, batch.num_prefill_tokens,
                     context, pairs)


def simulate(workload: Workload, choice: EngineChoice, cost: CostModel, vocab_size: int,
             keep_steps: bool = False, sample_times: list[float] = (),
             by_step: bool = False) -> SimResult:
    """`sample_times`: sorted workload times at which to read the pool as a snapshot taken
    then would (the state after the last step that ended before). `by_step`: each request
    arrives just before the step that first scheduled it in the recording (its arrival_step;
    the recorded engine's choice only), so the batches are the engine's whatever the cost
    model's step times: the replay of its blocks and preemptions, not a prediction of time."""
    if by_step and any(r.arrival_step is None for r in workload.initial()):
        raise ValueError("by_step: every request needs its recorded arrival_step")
    manager = BlockManager(choice.num_blocks, choice.block_size, choice.enable_prefix_caching,
                           list(choice.windows))
    swap = _swap_space(choice, manager)
    extra = {"swap": swap} if swap is not None else {}  # a scheduler without swap takes none
    scheduler = Scheduler(manager, choice.max_num_seqs, choice.max_num_batched_tokens,
                          choice.max_model_len, speculative=False, **extra)
    result = SimResult(choice, [])
    pending: list[tuple[float, int, PlannedRequest]] = []  # (arrival, order, request) heap
    order = 0
    for planned in workload.initial():
        heapq.heappush(pending, (_release_key(planned, by_step), order, planned))
        order += 1
    live: dict[str, tuple[Request, PlannedRequest, RequestResult, random.Random]] = {}
    now = workload.start_s
    samples = list(reversed(sample_times))  # popped from the end, earliest first
    held_now = 0  # blocks held since the last step ended
    while pending or scheduler.has_unfinished_requests():
        release = scheduler.num_schedules + 1 if by_step else now
        while pending and pending[0][0] <= release:
            _, _, planned = heapq.heappop(pending)
            _add(scheduler, planned, result, live)
        if not scheduler.has_unfinished_requests():  # idle until the next arrival
            if by_step:  # the engine's next step is the one that scheduled it
                _, _, planned = heapq.heappop(pending)
                now = max(now, planned.arrival_s)
                _add(scheduler, planned, result, live)
            else:
                now = pending[0][0]
            continue
        batch = scheduler.schedule()
        if batch.empty:
            if pending and by_step:
                continue  # the next step's arrivals join then
            if pending:
                now = pending[0][0]
                continue
            stuck = scheduler.waiting[0]
            raise ValueError(f"request {stuck.request_id} ({stuck.num_tokens} tokens) can never be "
                             f"scheduled: the pool of {choice.num_blocks} blocks of "
                             f"{choice.block_size} tokens cannot hold it ({choice.label})")
        shape = step_shape(batch)
        if keep_steps:
            result.step_shapes.append(shape)
        result.peak_blocks = max(result.peak_blocks, manager.num_blocks - manager.num_free_blocks)
        result.max_running = max(result.max_running, len(scheduler.running))
        result.prompt_tokens_computed += batch.num_prefill_tokens
        now += cost.step_seconds(shape)
        if swap is not None:
            swap.pending.pop(batch.step, None)  # the engine's copy timings: none here
            copied = len(batch.blocks_to_swap_out) + len(batch.blocks_to_swap_in)
            now += cost.copy_seconds(copied * choice.block_bytes)
            result.swapped_blocks += copied
        sampled: list[int | None] = []
        for request, n in zip(batch.requests, batch.num_new_tokens):
            if request.num_computed_tokens + n >= request.num_tokens:
                sampled.append(live[request.request_id][3].randrange(FIRST_TOKEN_ID, vocab_size))
            else:
                sampled.append(None)
        for request, token in zip(batch.requests, sampled):
            if token is not None:
                live[request.request_id][2].add_token(now)
        result.generated_tokens += sum(token is not None for token in sampled)
        while samples and samples[-1] < now:  # snapshots taken while this step ran
            samples.pop()
            result.peak_blocks_sampled = max(result.peak_blocks_sampled, held_now)
        finished = scheduler.update_from_output(batch, sampled)
        held_now = manager.num_blocks - manager.num_free_blocks
        result.peak_blocks_after_step = max(result.peak_blocks_after_step, held_now)
        result.num_steps += 1
        if result.num_steps > MAX_STEPS:
            raise ValueError(f"the simulation passed {MAX_STEPS} steps; shorten the workload")
        for request in finished:
            _, planned, request_result, _ = live.pop(request.request_id)
            request_result.finished_s = now
            request_result.num_output_tokens = request.num_output_tokens
            request_result.num_cached_tokens = request.num_cached_tokens
            request_result.num_preemptions = request.num_preemptions
            follow = workload.follow_up(planned, request.output_token_ids, now)
            if follow is not None:
                heapq.heappush(pending, (follow.arrival_s, order, follow))
                order += 1
    if samples:  # snapshots after the last step
        result.peak_blocks_sampled = max(result.peak_blocks_sampled, held_now)
    result.num_preemptions = scheduler.num_preemptions
    result.duration_s = now
    result.prefix_cache_queries = manager.prefix_cache_queries
    result.prefix_cache_hits = manager.prefix_cache_hits
    return result


def _release_key(planned: PlannedRequest, by_step: bool) -> float:
    return planned.arrival_step if by_step else planned.arrival_s


def _swap_space(choice: EngineChoice, manager: BlockManager):
    """The engine's swap space, sized as build_swap_space does (less its cap at half the host's
    free memory); None under recompute."""
    if choice.preemption_mode == "recompute" or choice.swap_space_gib == 0:
        return None
    try:
        from kvdeck.engine.core.host_block_pool import HostBlockPool
        from kvdeck.engine.core.swap import SwapSpace
    except ImportError:
        raise ValueError(f"preemption_mode {choice.preemption_mode!r}: this kvdeck's engine has "
                         "no swap preemption") from None
    if choice.block_bytes <= 0:
        raise ValueError("swap preemption needs the KV block size in bytes (the model's shape)")
    slots = min(int(choice.swap_space_gib * GIB) // choice.block_bytes, 4 * choice.num_blocks)
    if slots == 0:
        return None
    return SwapSpace(manager, HostBlockPool(slots), choice.preemption_mode, choice.block_bytes)


def _add(scheduler: Scheduler, planned: PlannedRequest, result: SimResult, live: dict) -> None:
    if len(planned.prompt_token_ids) + 1 > scheduler.max_model_len:
        result.rejected.append(planned.request_id)  # the engine refuses it at the door
        return
    request = Request(planned.request_id, list(planned.prompt_token_ids),
                      SamplingParams(max_tokens=planned.output_len, ignore_eos=True,
                                     temperature=0.0, detokenize=False), set())
    request_result = RequestResult(planned.request_id, planned.arrival_s, len(planned.prompt_token_ids))
    result.requests.append(request_result)
    live[planned.request_id] = (request, planned, request_result, _token_source(planned.request_id))
    scheduler.add_request(request)
