"""Prometheus exposition with vLLM's metric names, so dashboards made for vLLM work.

Three sources feed one private registry:
- per-request events, observed on the client as outputs stream by (token counters,
  request_success by finish reason, error, latency histograms from the engine's own
  timestamps), including the last word of requests an engine crash took down;
- per-step token counts, streamed by the engine (iteration_tokens_total);
- the engine's latest stats snapshot and its start-up facts, read at scrape time (gauges,
  the core's cumulative counters, cache_config_info).
Nothing is kept per request once it has finished. No `_created` series (as vLLM).
"""

import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvdeck.app.serve.tier_metrics import SampleFamilies, kv_tier_families
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.stats import EngineStats
from kvdeck.engine.types.wire import EngineInfo

disable_created_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets (CPU runs land in the low end, GPU runs in the middle).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                           15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                           1920.0, 7680.0)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000,
                       50000, 100000)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
N_BUCKETS = (1, 2, 5, 10, 20, 50, 100)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort", "error")
GRAMMAR_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0)

StatsSource = Callable[[], EngineStats | None]


class MetricsSource(Protocol):
    """What the metrics read from the engine client besides outputs."""

    info: EngineInfo | None

    def add_step_listener(self, listener: Callable[[list[int], int, list[int]], None]) -> None: ...


class EngineMetrics:
    def __init__(self, model_name: str, stats_source: StatsSource,
                 engine: MetricsSource | None = None, max_loras: int | None = None) -> None:
        """`max_loras`: the engine's, when LoRA is on (vllm:lora_requests_info is exported)."""
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        reg, name = self.registry, ["model_name"]
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", name,
                                     registry=reg)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens produced.",
                                         name, registry=reg)
        self.request_success = Counter("vllm:request_success", "Finished requests by reason.",
                                       name + ["finished_reason"], registry=reg)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time from arrival to the first generated token.", name,
                              buckets=TTFT_BUCKETS, registry=reg)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Time between consecutive generated tokens.", name,
                             buckets=ITL_BUCKETS, registry=reg)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Time from arrival to the end of the request.", name,
                             buckets=REQUEST_LATENCY_BUCKETS, registry=reg)
        self.queue_time = Histogram("vllm:request_queue_time_seconds",
                                    "Time a request waited before it was first scheduled.", name,
                                    buckets=REQUEST_LATENCY_BUCKETS, registry=reg)
        self.prefill_time = Histogram("vllm:request_prefill_time_seconds",
                                      "Time from first schedule to the first token.", name,
                                      buckets=REQUEST_LATENCY_BUCKETS, registry=reg)
        self.decode_time = Histogram("vllm:request_decode_time_seconds",
                                     "Time from the first token to the last.", name,
                                     buckets=REQUEST_LATENCY_BUCKETS, registry=reg)
        self.prompt_len = Histogram("vllm:request_prompt_tokens", "Prompt length per request.",
                                    name, buckets=TOKEN_COUNT_BUCKETS, registry=reg)
        self.generation_len = Histogram("vllm:request_generation_tokens",
                                        "Generated tokens per request.", name,
                                        buckets=TOKEN_COUNT_BUCKETS, registry=reg)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Mean time between output tokens of a request (after the first).",
                              name, buckets=TPOT_BUCKETS, registry=reg)
        self.params_n = Histogram("vllm:request_params_n", "The n of each request.", name,
                                  buckets=N_BUCKETS, registry=reg)
        self.params_max_tokens = Histogram("vllm:request_params_max_tokens",
                                           "The max_tokens of each request that set it.", name,
                                           buckets=TOKEN_COUNT_BUCKETS, registry=reg)
        self.iteration_tokens = Histogram("vllm:iteration_tokens_total",
                                          "Tokens computed per engine step.", name,
                                          buckets=ITERATION_TOKEN_BUCKETS, registry=reg)
        self.errors = Counter("kvdeck:request_errors", "Requests that ended in an error (a failure "
                              "in the engine, or an engine crash).", name, registry=reg)
        self.constrained = Counter("kvdeck:structured_output_requests",
                                   "Requests whose output a grammar constrains (JSON, regex, choice, "
                                   "grammar, forced tool calls).", name, registry=reg)
        self.grammar_compile = Histogram("kvdeck:grammar_compile_seconds",
                                         "Time from a request's arrival in the engine to its grammar "
                                         "being ready.", name, buckets=GRAMMAR_BUCKETS, registry=reg)
        # Series exist (at 0) from the start, so rate() works from the first scrape.
        for metric in (self.prompt_tokens, self.generation_tokens, self.ttft, self.itl, self.e2e,
                       self.queue_time, self.prefill_time, self.decode_time, self.prompt_len,
                       self.generation_len, self.tpot, self.params_n, self.params_max_tokens,
                       self.iteration_tokens, self.errors, self.constrained, self.grammar_compile):
            metric.labels(model_name)
        for reason in FINISH_REASONS:
            self.request_success.labels(model_name, reason)
        reg.register(_EngineStatsCollector(model_name, stats_source, engine, max_loras))
        if engine is not None:
            engine.add_step_listener(self.observe_steps)
        # request id -> (tokens seen, time of the newest token), while the request runs
        self._progress: dict[str, tuple[int, float | None]] = {}

    def observe_request_params(self, n: int, max_tokens: int | None) -> None:
        """Once per API request, before it is split into choices."""
        self.params_n.labels(self.model_name).observe(n)
        if max_tokens is not None:
            self.params_max_tokens.labels(self.model_name).observe(max_tokens)

    def observe_constrained(self) -> None:
        """Once per API request whose output is constrained."""
        self.constrained.labels(self.model_name).inc()

    def observe_steps(self, tokens_per_step: list[int], last_step: int = 0,
                      used_blocks: list[int] | None = None) -> None:
        histogram = self.iteration_tokens.labels(self.model_name)
        for tokens in tokens_per_step:
            histogram.observe(tokens)

    def observe_output(self, output: RequestOutput) -> None:
        """Feed one streamed RequestOutput (AsyncLLM.add_output_listener)."""
        label = self.model_name
        metrics = output.metrics
        seen, last_time = self._progress.get(output.request_id, (0, None))
        new_tokens = len(output.delta_token_ids)
        if new_tokens:
            if seen == 0:
                self.prompt_tokens.labels(label).inc(len(output.prompt_token_ids))
                if metrics.time_to_first_token is not None:
                    self.ttft.labels(label).observe(metrics.time_to_first_token)
                gaps = new_tokens - 1
            else:
                gaps = new_tokens
            now = metrics.last_token_time
            if gaps and now is not None and last_time is not None:
                for _ in range(gaps):  # one engine step per token: spread evenly if batched
                    self.itl.labels(label).observe(max(0.0, now - last_time) / gaps)
            self.generation_tokens.labels(label).inc(new_tokens)
            seen, last_time = seen + new_tokens, now
        if not output.finished:
            self._progress[output.request_id] = (seen, last_time)
            return
        self._progress.pop(output.request_id, None)
        reason = output.outputs[0].finish_reason or "abort"
        self.request_success.labels(label, reason).inc()
        if reason == "error":
            self.errors.labels(label).inc()
        if metrics.grammar_compile_s is not None:
            self.grammar_compile.labels(label).observe(metrics.grammar_compile_s)
        first, last = metrics.first_token_time, metrics.last_token_time
        if seen > 1 and first is not None and last is not None:
            self.tpot.labels(label).observe(max(0.0, last - first) / (seen - 1))
        if metrics.finished_time is not None:
            self.e2e.labels(label).observe(max(0.0, metrics.finished_time - metrics.arrival_time))
        if metrics.queue_time is not None:
            self.queue_time.labels(label).observe(max(0.0, metrics.queue_time))
        first_token, scheduled = metrics.first_token_time, metrics.first_scheduled_time
        if first_token is not None and scheduled is not None:
            self.prefill_time.labels(label).observe(max(0.0, first_token - scheduled))
            if metrics.last_token_time is not None:
                self.decode_time.labels(label).observe(
                    max(0.0, metrics.last_token_time - first_token))
        if seen:
            self.prompt_len.labels(label).observe(len(output.prompt_token_ids))
            self.generation_len.labels(label).observe(seen)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineStatsCollector(Collector):
    """Gauges and the core's own counters, from the newest stats snapshot at scrape time."""

    def __init__(self, model_name: str, stats_source: StatsSource,
                 engine: MetricsSource | None, max_loras: int | None = None) -> None:
        self.model_name = model_name
        self.stats_source = stats_source
        self.engine = engine
        self.max_loras = max_loras

    def describe(self) -> Iterator:
        return iter(())  # families vary with the snapshot; nothing to pre-register

    def collect(self) -> Iterator:
        stats = self.stats_source()
        labels = ["model_name"]
        values = [self.model_name]

        families = SampleFamilies(labels, values)
        gauge, counter = families.gauge, families.counter

        info = self.engine.info if self.engine is not None else None
        if info is not None:
            family = GaugeMetricFamily("vllm:cache_config_info", "The KV cache's configuration.",
                                       labels=[*labels, *CACHE_CONFIG_LABELS])
            family.add_metric([*values, *cache_config_values(info)], 1.0)
            yield family
        running = stats.num_running if stats else 0
        waiting = stats.num_waiting if stats else 0
        yield gauge("vllm:num_requests_running", "Requests in the running batch.", running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).",
                    stats.kv_cache_usage if stats else 0.0)
        if self.max_loras is not None:
            yield lora_requests_info(stats, self.max_loras)
        if stats is None:
            return
        yield gauge("kvdeck:num_kv_blocks", "KV cache blocks in the pool.", stats.num_blocks)
        yield gauge("kvdeck:num_kv_blocks_free", "Free KV blocks (incl. cached ones).",
                    stats.num_free_blocks)
        yield gauge("kvdeck:num_kv_blocks_cached", "Free blocks still holding a reusable prefix.",
                    stats.num_cached_blocks)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      stats.prefix_cache_queries)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                      stats.prefix_cache_hits)
        yield counter("vllm:num_preemptions", "Requests preempted (recomputed, or swapped out and back).",
                      stats.num_preemptions)
        yield counter("kvdeck:engine_steps", "Engine steps run.", stats.num_steps)
        yield counter("kvdeck:kernel_compiles", "Kernel variants the engine compiled: the start-up "
                      "warm-up's, then any a batch needed while serving (each a stall of about a "
                      "second on a GPU).", stats.kernel_compiles_total)
        yield counter("kvdeck:kv_window_released_blocks",
                      "KV blocks released because they slid out of a sliding window.",
                      stats.num_window_released_blocks)
        yield from kv_tier_families(stats, labels, values)  # swap space, host and disk tiers
        if stats.spec is not None:
            yield from _spec_decode_families(stats, labels, values)


def _spec_decode_families(stats: EngineStats, labels: list[str], values: list[str]) -> Iterator:
    """vLLM's speculative decoding counters (present only when speculation is configured)."""
    spec = stats.spec
    for name, doc, value in (
        ("vllm:spec_decode_num_drafts", "Verification steps that carried draft tokens.", spec.num_drafts),
        ("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed and verified.", spec.num_draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", spec.num_accepted_tokens),
    ):
        family = CounterMetricFamily(name, doc, labels=labels)
        family.add_metric(values, value)
        yield family
    per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "Draft tokens accepted, by position in the draft.",
                                  labels=[*labels, "position"])
    for position, value in enumerate(spec.num_accepted_tokens_per_pos):
        per_pos.add_metric([*values, str(position)], value)
    yield per_pos


_RUNNING_STATES = ("prefilling", "decoding")


def lora_requests_info(stats: EngineStats | None, max_loras: int) -> GaugeMetricFamily:
    """vLLM's `vllm:lora_requests_info`: the adapters with requests running and waiting (names,
    comma-separated) and max_lora as labels; the value is when that was true (the snapshot's
    wall-clock time), as vLLM sets it. No model_name label, as vLLM's."""
    running: set[str] = set()
    waiting: set[str] = set()
    for request in stats.requests if stats is not None else ():
        if request.lora_name is not None:
            (running if request.state in _RUNNING_STATES else waiting).add(request.lora_name)
    family = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                               labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
    family.add_metric([",".join(sorted(running)), ",".join(sorted(waiting)), str(max_loras)],
                      stats.timestamp if stats is not None else time.time())
    return family


# vLLM's labels, then kvdeck's: bytes per block and the tokens the pool holds (what an 8-bit
# cache doubles) and the sliding windows of the KV groups ("none" for full attention).
CACHE_CONFIG_LABELS = ("block_size", "cache_dtype", "num_gpu_blocks", "num_cpu_blocks",
                       "enable_prefix_caching", "sliding_window", "kv_bytes_per_token",
                       "kv_bytes_per_block", "kv_cache_tokens", "device")


def cache_config_values(info: EngineInfo) -> list[str]:
    on_gpu = info.device.startswith("cuda")
    windows = sorted({w for w in info.kv_group_windows if w is not None})
    return [str(info.block_size), info.kv_cache_dtype, str(info.num_blocks if on_gpu else 0),
            str(0 if on_gpu else info.num_blocks), str(info.enable_prefix_caching).lower(),
            ",".join(map(str, windows)) or "none", str(info.kv_bytes_per_token),
            str(info.kv_bytes_per_block), str(info.kv_cache_tokens), info.device]
