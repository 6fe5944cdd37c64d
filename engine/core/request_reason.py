"""Why a request is where it is, in one line ("waiting: needs 12 blocks, 4 free; 3 requests
ahead"), and its timeline, for the requests a stats snapshot carries: worked out from the
scheduler's state only when a snapshot is taken, never per step."""

import time

from kvdeck.engine.core.request import Request, RequestStatus
from kvdeck.engine.core.scheduler import Scheduler
from kvdeck.engine.types.arith import cdiv
from kvdeck.engine.types.request_timeline import TimelineSnapshot
from kvdeck.engine.types.spec_stats import RequestSpecStats
from kvdeck.engine.types.stats import RequestStats


def describe_requests(entries: list[RequestStats], requests: list[Request], scheduler: Scheduler) -> None:
    """Fill in each entry's timeline and reason line (entries[i] describes requests[i]; waiting
    requests in queue order, after the running ones)."""
    now = time.monotonic()
    step = scheduler.num_schedules
    ahead = 0
    for entry, request in zip(entries, requests, strict=True):
        timeline = request.timeline.snapshot(now, step, len(request.output_token_ids))
        add_extras(timeline, entry.spec, entry.grammar_compile_s)
        entry.timeline = timeline
        entry.reason = reason_line(request, scheduler, ahead)
        if request.status is not RequestStatus.RUNNING:
            ahead += 1


def add_extras(timeline: TimelineSnapshot, spec: RequestSpecStats | None,
               grammar_compile_s: float | None) -> None:
    """What other parts of the engine keep: speculative totals, the grammar's compile time."""
    if spec is not None:
        timeline.spec_verify_steps = spec.num_drafts
        timeline.spec_drafted = spec.num_draft_tokens
        timeline.spec_accepted = spec.num_accepted_tokens
    timeline.grammar_compile_s = grammar_compile_s


def reason_line(request: Request, scheduler: Scheduler, ahead: int) -> str:
    """`ahead`: waiting requests in front of it in the queue."""
    preempted = preemption_text(request)
    if request.status is RequestStatus.RUNNING:
        out = request.num_output_tokens
        now = prefill_text(request, scheduler) if request.is_prefilling \
            else f"decoding: {out:,} token{'s' if out != 1 else ''} out"
    elif request.status.finished:
        now = f"finished: {request.status.value}"
    elif request.status is RequestStatus.SWAPPED:
        now = f"{swapped_text(request)}; {waiting_text(request, scheduler, ahead)}"
        preempted = preempted if request.num_preemptions > 1 else ""
    else:
        now = waiting_text(request, scheduler, ahead)
    return f"{preempted}; {now}" if preempted else now


def waiting_text(request: Request, scheduler: Scheduler, ahead: int) -> str:
    queue = f"; {ahead} request{'s' if ahead != 1 else ''} ahead" if ahead else ""
    if request.waiting_for_grammar:
        return f"waiting: compiling its grammar{queue}"
    if len(scheduler.running) >= scheduler.max_num_seqs:
        return f"waiting: batch full ({len(scheduler.running)} of {scheduler.max_num_seqs} sequences){queue}"
    manager = scheduler.block_manager
    # Its first chunk's blocks (a prefix-cache hit may need fewer: looking it up costs hashing).
    needed = manager.blocks_needed(min(request.num_tokens, scheduler.max_num_batched_tokens))
    return f"waiting: needs {needed} blocks, {manager.num_free_blocks} free{queue}"


def swapped_text(request: Request) -> str:
    """Its latest preemption swapped its K/V out: for whom, and how much it holds there."""
    timeline = request.timeline
    by = timeline.preemptions[-1][2] if timeline.preemptions else ""
    nbytes = timeline.swaps[-1][1] if timeline.swaps else 0
    return f"swapped out for {by or 'its own growth'} ({nbytes / (1 << 20):.1f} MiB in host memory)"


def prefill_text(request: Request, scheduler: Scheduler) -> str:
    timeline = request.timeline
    done = timeline.chunks_since_admit
    left = cdiv(max(0, request.num_tokens - request.num_computed_tokens), scheduler.max_num_batched_tokens)
    what = "recompute" if request.num_preemptions else "prefill"
    return (f"{what}: chunk {done} of {done + left} ({request.num_computed_tokens:,} of "
            f"{request.num_tokens:,} tokens, {timeline.cached_at_admit:,} from cache)")


def preemption_text(request: Request) -> str:
    count = request.num_preemptions
    if not count:
        return ""
    times = {1: "once", 2: "twice"}.get(count, f"{count} times")
    needed_by = list(dict.fromkeys(by or "its own growth" for _, _, by in request.timeline.preemptions))
    return f"preempted {times} (for {', '.join(needed_by)})"
