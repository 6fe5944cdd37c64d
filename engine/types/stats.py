"""A snapshot of the engine's state for the dashboard and /metrics."""

import array
import base64
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdeck.engine.types.request_timeline import TimelineSnapshot, timeline_from_dict
from kvdeck.engine.types.spec_stats import RequestSpecStats, SpecDecodeStats

if TYPE_CHECKING:
    from kvdeck.engine.types.outputs import RequestOutput


@dataclass(slots=True)
class RequestStats:
    request_id: str
    state: str  # "waiting" | "prefilling" | "decoding" | "preempted"
    num_prompt_tokens: int
    num_computed_tokens: int
    num_output_tokens: int
    # Logical block i -> physical block id, or -1 where a sliding window released it (the
    # first KV group's table: the only one unless the model is hybrid).
    block_table: list[int]
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    spec: RequestSpecStats | None = None  # speculative decoding, when it is on
    constrained: bool = False  # its output must match a grammar (structured outputs)
    grammar_compile_s: float | None = None  # how long its grammar took (None: not yet ready)
    # Hybrid models (several KV groups, see kv_group_windows): every group's table, in
    # group order (block_tables[0] is block_table); empty for one group.
    block_tables: list[list[int]] = field(default_factory=list)
    # Why it is where it is ("waiting: needs 12 blocks, 4 free; 3 requests ahead") and what
    # happened to it so far (engine/core/request_reason.py).
    reason: str = ""
    timeline: TimelineSnapshot | None = None
    # Prompt tokens served from the prefix cache's host and disk tiers (num_cached_tokens
    # counts the device pool's); what a swap cost is on its timeline (timeline.swaps).
    num_host_cached_tokens: int = 0
    num_disk_cached_tokens: int = 0
    lora_name: str | None = None  # the LoRA adapter it runs under (None: the base model)


@dataclass(slots=True)
class LoRASlotStats:
    """Multi-LoRA's device slots and host copies (engine/runner/lora/manager.py)."""

    slot_adapters: list[str | None]  # the adapter in each of the max_loras slots (None: free)
    slot_ranks: list[int]  # its rank (0: free)
    host_adapters: int  # adapters checked and held on the host (the LRU)
    max_cpu_loras: int  # the LRU's size


@dataclass(slots=True)
class EngineStats:
    timestamp: float
    num_running: int
    num_waiting: int
    num_preempted: int  # waiting requests that were preempted and will be recomputed
    kv_cache_usage: float  # fraction of blocks in use (cached-but-free blocks count as free)
    num_blocks: int
    block_size: int
    num_free_blocks: int  # includes cached blocks that can be evicted
    num_cached_blocks: int  # free blocks still holding a reusable prefix
    # Per physical block: reference count and whether it holds a hashed (full, cacheable) prefix.
    block_ref_counts: list[int]
    block_is_cached: list[bool]
    # Blocks written by the last step (new K/V landed in them).
    blocks_written_last_step: list[int]
    requests: list[RequestStats]
    # Counters since start.
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int  # prompt tokens found in the cache
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_finished: int
    num_steps: int
    # The last step's batch.
    last_step_prefill_tokens: int
    last_step_decode_tokens: int
    last_step_num_seqs: int
    last_step_duration_s: float
    finished_reasons: dict[str, int] = field(default_factory=dict)
    spec: SpecDecodeStats | None = None  # speculative decoding, when it is on
    # The KV pool's format and size: the stored type (float32 | float16 | bfloat16 |
    # fp8_e4m3 | fp8_e5m2 | int8), bytes per block (every layer slot, scales included) and
    # the tokens whose K/V it holds for every layer at once.
    kv_cache_dtype: str = ""
    kv_bytes_per_block: int = 0
    kv_cache_tokens: int = 0
    # Blocks released because they slid out of a sliding window (since start).
    num_window_released_blocks: int = 0
    # Hybrid models: the KV group of each physical block's cached prefix; empty for one group.
    block_group: list[int] = field(default_factory=list)
    # Kernel variants the engine's process compiled (since start): the start-up warm-up's,
    # then any a batch needed later, each a stall of about a second on a GPU.
    kernel_compiles_total: int = 0
    # KV tiers (docs/architecture/kv-tiers.md). Swap preemption's host swap space: blocks
    # holding swapped-out K/V and its size, waiting requests swapped out, and (since start)
    # requests swapped out and back in, the blocks they copied and the copies' seconds.
    host_swap_blocks_used: int = 0
    host_swap_blocks_total: int = 0
    num_swapped: int = 0
    swap_outs_total: int = 0
    swap_ins_total: int = 0
    swap_out_blocks_total: int = 0
    swap_in_blocks_total: int = 0
    swap_seconds_total: float = 0.0
    # The prefix cache's host-memory and disk tiers (--kv-offload-gib, --kv-cache-dir): full
    # blocks held and room for, and (since start) prompt tokens looked up in each tier (those
    # the tiers above it missed) and found there.
    host_cache_blocks: int = 0
    host_cache_blocks_total: int = 0
    disk_cache_blocks: int = 0
    disk_cache_blocks_total: int = 0
    host_cache_queries: int = 0
    host_cache_hits: int = 0
    disk_cache_queries: int = 0
    disk_cache_hits: int = 0
    lora: LoRASlotStats | None = None  # with enable_lora


@dataclass(slots=True)
class StepSummary:
    """The last step's batch, as the dashboard's status line shows it."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    num_seqs: int = 0
    duration_s: float = 0.0


@dataclass(slots=True)
class KVOccupancy:
    """The running batch's hold on the KV pool (benchmarks read it every step)."""

    usage: float  # fraction of blocks in use
    num_running: int
    allocated_tokens: int  # slots in the running requests' blocks
    computed_tokens: int  # of those, slots holding K/V (the rest is the last blocks' waste)


@dataclass(slots=True)
class StepTimings:
    """Where step time goes: host work (schedule, prepare, update, and the front-end's turning
    core outputs into callers' outputs) vs the model + sampler."""

    steps: int = 0
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    model_s: float = 0.0
    update_s: float = 0.0
    frontend_s: float = 0.0  # filled in by a front-end in the same process (LLMEngine)
    swap_s: float = 0.0  # of model_s: swap preemption's block copies (runner/kv_swap.py)

    def add(self, schedule: float, prepare: float, model: float, update: float) -> None:
        self.steps += 1
        self.schedule_s += schedule
        self.prepare_s += prepare
        self.model_s += model
        self.update_s += update

    @property
    def host_s(self) -> float:
        return self.schedule_s + self.prepare_s + self.update_s + self.frontend_s

    @property
    def host_share(self) -> float:
        total = self.host_s + self.model_s
        return self.host_s / total if total else 0.0


def final_request_stats(output: "RequestOutput") -> RequestStats:
    """A finished request as its final output (one choice, under its engine request id)
    describes it: the counts and timeline the last snapshot it was in may lack (that
    snapshot predates its last steps, or it ended between two). No block table: its blocks
    are freed."""
    completion = output.outputs[0] if output.outputs else None
    num_output = len(completion.token_ids) if completion is not None else 0
    num_prompt = len(output.prompt_token_ids)
    return RequestStats(
        request_id=output.request_id, state="finished", num_prompt_tokens=num_prompt,
        # The last token sampled was never fed back: its K/V was not computed.
        num_computed_tokens=num_prompt + num_output - 1 if num_output else 0,
        num_output_tokens=num_output, block_table=[],
        num_cached_tokens=output.num_cached_tokens, timeline=output.metrics.timeline)


def request_stats_to_dict(request: RequestStats) -> dict:
    return _shallow_dict(request)


def stats_to_dict(stats: EngineStats) -> dict:
    """A snapshot as JSON-ready data (the stats stream of `kvdeck --serve`). The lists of
    numbers are shared, not copied: dataclasses.asdict deep-copies every element, 15 ms a
    snapshot for a 10,922-block pool, which cost a busy server a quarter of its throughput
    while one dashboard watched (benchmarks/bench_attach_cost.py). The two per-block lists
    travel packed: the cached flags as a string of "0"/"1" (one byte a block, not "false, "),
    the reference counts as base64 of little-endian uint16s; stats_from_dict unpacks both
    (and still reads plain lists)."""
    data = _shallow_dict(stats)
    data["block_is_cached"] = bytes(stats.block_is_cached).translate(_FLAG_DIGITS).decode()
    refs = stats.block_ref_counts
    if refs and max(refs) < 1 << 16:  # base64 of uint16s: a 10th of the time json takes
        data["block_ref_counts"] = base64.b64encode(_little_endian(array.array("H", refs))).decode()
    return data


def _little_endian(values: array.array) -> array.array:
    if sys.byteorder == "big":
        values.byteswap()
    return values


_FLAG_DIGITS = bytes.maketrans(b"\x00\x01", b"01")


def _shallow_dict(value: object) -> dict:
    out = {}
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        if dataclasses.is_dataclass(item):
            item = _shallow_dict(item)
        elif isinstance(item, list) and item and dataclasses.is_dataclass(item[0]):
            item = [_shallow_dict(element) for element in item]
        out[f.name] = item
    return out


def stats_from_dict(data: dict) -> EngineStats:
    """The inverse of stats_to_dict; unknown keys (a newer server) are ignored."""
    values = _known(EngineStats, data)
    refs = values.get("block_ref_counts", [])
    if isinstance(refs, str):
        values["block_ref_counts"] = _little_endian(array.array("H", base64.b64decode(refs))).tolist()
    cached = values.get("block_is_cached", [])
    values["block_is_cached"] = [flag == "1" for flag in cached] if isinstance(cached, str) \
        else [bool(flag) for flag in cached]
    values["requests"] = [request_stats_from_dict(r) for r in values.get("requests", [])]
    if values.get("spec") is not None:
        values["spec"] = SpecDecodeStats(**_known(SpecDecodeStats, values["spec"]))
    if values.get("lora") is not None:
        values["lora"] = LoRASlotStats(**_known(LoRASlotStats, values["lora"]))
    return EngineStats(**values)


def request_stats_from_dict(data: dict) -> RequestStats:
    """The inverse of request_stats_to_dict; unknown keys are ignored."""
    values = _known(RequestStats, data)
    if values.get("spec") is not None:
        values["spec"] = RequestSpecStats(**_known(RequestSpecStats, values["spec"]))
    if values.get("timeline") is not None:
        values["timeline"] = timeline_from_dict(values["timeline"])
    return RequestStats(**values)


def _known(cls: type, data: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}
