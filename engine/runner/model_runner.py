"""Owns the model and the KV pool; turns a scheduled batch into one forward pass.

Start-up: the constructor loads the model, `plan_kv_cache()` sizes the pool (profiling on
GPU, `kv_cache_memory_gib` on CPU) and returns a `KVCachePlan`, `allocate_kv_cache(plan.num_blocks)`
allocates it and `capture_decode_graphs()` records the decode graphs. A step:
`execute(batch)` packs the batch flat (varlen: all scheduled tokens of all requests in one
row, with query start offsets, context lengths, block tables and a slot per new token),
runs the model and samples, and returns a `StepResult`.
"""

import logging
import time
from collections.abc import Callable

import torch

from kvdeck.engine.runner.async_step import CudaStream, DeviceOutcome, LaunchedStep, SimulatedDevice
from kvdeck.engine.runner.batch import BatchPlan, TokenMasks
from kvdeck.engine.runner.cpu_threads import ThreadGovernor
from kvdeck.engine.runner.decode_graphs import DecodeGraphs
from kvdeck.engine.runner.device import resolve_device, resolve_dtype, token_budget
from kvdeck.engine.runner.host_memory import keep_freed_buffers_in_process
from kvdeck.engine.runner.input_batch import InputBatch
from kvdeck.engine.runner.kv_block_copy import KVBlockCopier
from kvdeck.engine.runner.kv_pool import KVPool, resolve_kv_format
from kvdeck.engine.runner.kv_swap import KVSwapper
from kvdeck.engine.runner.kv_tier_io import KVTierIO
from kvdeck.engine.runner.loader import init_dummy_weights, load_weights
from kvdeck.engine.runner.lora.manager import LoRAManager
from kvdeck.engine.runner.models import model_class_for, native_decode
from kvdeck.engine.runner.models.layers import AttentionMetadata, PagedAttention
from kvdeck.engine.runner.models.linear import UnquantizedLinearMethod, get_linear_method
from kvdeck.engine.runner.prompt_logprobs import prompt_logprobs
from kvdeck.engine.runner.sampler import Sampler, SampleResult
from kvdeck.engine.runner.step_copies import StepCopies
from kvdeck.engine.runner.step_sampling import StepSampler
from kvdeck.engine.runner.step_state import KVCachePlan, StepInputs, StepResult
from kvdeck.engine.runner.warmup import run_step, warm_up, warm_up_steps
from kvdeck.engine.runner.weight_bytes import weight_bytes_read_per_step
from kvdeck.engine.types.arith import cdiv
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.kv_groups import kv_cache_groups
from kvdeck.engine.types.model_config import ModelConfig
from kvdeck.kernels.compile_counter import kernel_compiles
from kvdeck.kernels.cpu import native as cpu_native
from kvdeck.kernels.dispatch import select_ops
from kvdeck.kernels.triton.attention_tuning import streaming_multiprocessors

logger = logging.getLogger(__name__)
ProgressCallback = Callable[[str, str], None]


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        model_dir,
        progress: ProgressCallback | None = None,
    ) -> None:
        progress = progress or (lambda stage, message: None)
        self.config = config
        self.model_config = model_config
        self.device = resolve_device(config)
        self.dtype = resolve_dtype(config, model_config, self.device)
        self.token_budget = token_budget(config, self.device)
        # The kernels' threads on the CPU: fewer while other processes keep cores busy.
        self.cpu_threads: ThreadGovernor | None = None
        if self.device.type == "cpu":
            keep_freed_buffers_in_process()
            self.cpu_threads = ThreadGovernor.for_engine(config.cpu_threads, torch.get_num_threads())
            self._apply_cpu_threads()
        self.block_size = config.block_size
        self.ops = select_ops(config.attention_backend, self.device)
        self.kv_pool = KVPool(resolve_kv_format(config.kv_cache_dtype, self.dtype, self.device),
                              kv_cache_groups(model_config.layer_windows), config.block_size,
                              model_config.num_key_value_heads, model_config.head_dim)
        progress("loading", f"loading weights from {model_dir}")
        self.model = self._build_model(model_dir)
        # Multi-LoRA: adapter slots on every projection adapters target (engine/runner/lora/).
        self.lora = LoRAManager(self.model, config.max_loras, config.max_lora_rank, config.cpu_loras,
                                self.dtype, self.device, config.attention_backend) \
            if config.enable_lora else None
        self.sampler = Sampler(self.device, config.seed)
        self.step_sampler = StepSampler(self.sampler, self.device)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        self.num_blocks = 0
        self.decode_graphs: DecodeGraphs | None = None  # CUDA graphs, or compiled CPU graphs
        self.device_queue: CudaStream | SimulatedDevice | None = None  # async scheduling's (launch)
        self.kv_tier_io: KVTierIO | None = None  # the prefix cache's host / disk tiers' copies
        self.kv_swap: KVSwapper | None = None  # host swap space (swap preemption)
        # Per-request rows that persist across steps; they grow past these sizes if needed.
        max_blocks = cdiv(config.max_model_len or 2048, self.block_size)
        self.input_batch = InputBatch(self.device, self.block_size, len(self.kv_pool.groups),
                                      config.max_num_seqs, max_blocks, model_config.long_rope_from)

    def _build_model(self, model_dir) -> torch.nn.Module:
        cls = model_class_for(self.model_config.architecture)
        quant_config = dict(self.model_config.quantization_config or {})
        # The INT4 GEMM follows the attention backend choice (triton | torch | auto).
        quant_config.setdefault("w4a16_backend", self.config.attention_backend)
        linear_method = get_linear_method(self.config.quantization, quant_config)
        previous_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                model = cls(self.model_config, self.ops, linear_method, self.dtype)
        finally:
            torch.set_default_dtype(previous_dtype)
        cpu_bf16 = self.device.type == "cpu" and self.dtype == torch.bfloat16
        # The dense layers' method: the model's own, or a quantised method's for what it keeps
        # dense (AWQ's output head).
        dense_method = getattr(linear_method, "dense", linear_method)
        if isinstance(dense_method, UnquantizedLinearMethod) and cpu_bf16:
            weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            dense_method.small_batch_gemv = cpu_native.worth_a_second_copy(weight_bytes)
        if self.config.load_format == "dummy":
            init_dummy_weights(model, self.config.seed)
        else:
            load_weights(model, model_dir, self.config.allow_pickle)
        if hasattr(linear_method, "output_head"):  # e.g. packed bf16 or int8 on CPU
            model.lm_head = linear_method.output_head(model.lm_head)
        return model.eval()

    # ---- the KV pool -------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        return self.kv_pool.bytes_per_block

    @property
    def k_caches(self) -> list[torch.Tensor]:
        """The pool's K tensors, one per storage slot (one per layer unless hybrid)."""
        return self.kv_pool.k

    @property
    def v_caches(self) -> list[torch.Tensor]:
        return self.kv_pool.v

    def plan_kv_cache(self, progress: ProgressCallback | None = None) -> KVCachePlan:
        if self.config.num_gpu_blocks_override is not None:
            num_blocks, sized_by = self.config.num_gpu_blocks_override, "override"
        elif self.device.type != "cuda":
            num_blocks = int(self.config.kv_cache_memory_gib * 2**30) // self.bytes_per_block
            sized_by = "kv_cache_memory_gib"
        else:
            if progress:
                progress("profiling", "profiling peak memory with a full-size batch")
            num_blocks, sized_by = self._profile_num_gpu_blocks(), "profiling"
        return KVCachePlan(num_blocks, self.block_size, self.bytes_per_block, sized_by,
                           len(self.kv_pool.groups))

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (engine/runner/weight_bytes.py)."""
        return weight_bytes_read_per_step(self.model)

    def _profile_num_gpu_blocks(self) -> int:
        budget = self.token_budget
        seq_len = min(budget, self.config.max_model_len or budget)
        num_seqs = max(1, budget // seq_len)
        scratch_blocks = num_seqs * cdiv(seq_len, self.block_size)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.allocate_kv_cache(scratch_blocks)
        scratch_bytes = scratch_blocks * self.bytes_per_block
        self._dummy_forward(num_seqs, seq_len)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        self.release_kv_cache()
        free, total = torch.cuda.mem_get_info()
        # Memory held outside torch's allocator (other processes, CUDA context) also counts.
        non_torch = total - free - torch.cuda.memory_reserved()
        available = total * self.config.gpu_memory_utilization - (peak - scratch_bytes) - non_torch
        num_blocks = int(available // self.bytes_per_block)
        if num_blocks <= 0:
            raise ValueError(
                "no GPU memory left for the KV cache after loading the model; raise "
                "gpu_memory_utilization or lower max_num_batched_tokens"
            )
        return num_blocks

    @torch.inference_mode()
    def _dummy_forward(self, num_seqs: int, seq_len: int) -> None:
        tokens = num_seqs * seq_len
        blocks_per_seq = cdiv(seq_len, self.block_size)
        tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32, device=self.device)
        tables = tables.view(num_seqs, blocks_per_seq)
        positions = torch.arange(seq_len, device=self.device).repeat(num_seqs)
        slots = (tables.long()[:, :, None] * self.block_size
                 + torch.arange(self.block_size, device=self.device)).view(num_seqs, -1)[:, :seq_len]
        slots = slots.reshape(-1)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=tables,
            query_start_loc=torch.arange(0, tokens + 1, seq_len, dtype=torch.int32, device=self.device),
            seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=self.device),
            max_query_len=seq_len,
            max_seq_len=seq_len,
            # Scratch: every group may write the same blocks.
            other_groups=((slots, tables),) * (len(self.kv_pool.groups) - 1),
        )
        input_ids = torch.zeros(tokens, dtype=torch.long, device=self.device)
        hidden = self.model(input_ids, positions, meta)
        self.model.compute_logits(hidden[meta.query_start_loc[1:].long() - 1])

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate a pool of `num_blocks` blocks (a plan's, or a profiling scratch pool)."""
        self.kv_pool.allocate(num_blocks, self.device)
        self.kv_pool.bind(self.attention_layers)
        native_decode.bind_decoder_stack(self.model)
        self.num_blocks = num_blocks

    def fallbacks(self) -> list[str]:
        """What this runner fell back from, in words, for the user (EngineInfo.fallbacks)."""
        notes = []
        if self.device.type == "cpu" and self.config.device == "auto":
            build = "" if torch.version.cuda else " (this torch build has no CUDA)"
            notes.append(f"no CUDA GPU found: running on the CPU{build}")
        if self.device.type == "cpu" and (why := native_decode.why_no_decoder_stack(self.model)):
            notes.append(f"decode steps run the Python forward, not the native CPU decoder "
                         f"stack: {why}")
        return notes

    def decoder_stack_rows(self) -> int | None:
        """The most rows a step may have and keep to the CPU decoder stack's arithmetic (a
        speculative verify within it gets a one-row step's bits); None: no such limit."""
        return native_decode.decoder_stack_rows(self.model)

    def allocate_swap_space(self, num_slots: int) -> None:
        """Host swap space for `num_slots` blocks of the allocated pool (0: none)."""
        self.kv_swap = KVSwapper.for_pool(KVBlockCopier.from_pool(self.kv_pool), num_slots) \
            if num_slots else None

    def release_kv_cache(self) -> None:
        self.kv_tier_io = None  # its copier views the pool's tensors
        self.kv_swap = None  # its copier views the pool's tensors
        native_decode.unbind_decoder_stack(self.model)  # it holds the caches' addresses
        self.kv_pool.release(self.attention_layers)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def shutdown(self) -> None:
        """Free the graphs, the KV pool and the model now, not whenever a reference cycle
        is collected: the next engine in this process profiles the memory left free."""
        self.decode_graphs = None
        if isinstance(self.device_queue, SimulatedDevice):
            self.device_queue.shutdown()
        self.release_kv_cache()
        self.attention_layers = []
        self.model = None
        self.sampler.request_generators.clear()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    # ---- CUDA graphs ---------------------------------------------------------------
    @property
    def cuda_graphs_supported(self) -> bool:
        # The torch attention reference plans on the host (.tolist()), which a graph
        # cannot record; the Triton kernels read everything from device memory.
        return self.device.type == "cuda" and self.ops.name == "triton"

    def capture_decode_graphs(self, max_model_len: int, progress: ProgressCallback | None = None,
                              capture: bool = True, max_rows: int | None = None) -> None:
        """Capture decode graphs for every batch-size bucket, then check one replay against
        an eager forward; on any failure the engine stays eager and says why.

        `capture=False` runs the same static-buffer path eagerly (tests without CUDA).
        `max_rows`: the largest decode batch in rows (speculative verify chunks add k rows per
        request); default max_num_seqs.
        """
        graphs = DecodeGraphs(self.model, max_rows or self.config.max_num_seqs, max_model_len,
                              self.block_size, self.model_config.hidden_size, self.dtype, self.device,
                              num_kv_groups=len(self.kv_pool.groups),
                              num_kv_heads=self.model_config.num_key_value_heads,
                              num_sms=streaming_multiprocessors(self.device), with_logits=True,
                              lora=self.lora.graph_inputs(max_rows or self.config.max_num_seqs)
                              if self.lora is not None else None)
        if progress:
            progress("capturing", f"capturing CUDA graphs for decode batch sizes up to "
                                  f"{graphs.max_batch_size}")
        try:
            if capture:
                graphs.capture()
            else:
                graphs.use_eager_replays()
            mismatch = graphs.compare_with_eager(self.num_blocks)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            logger.warning("CUDA graph capture failed, decode runs eagerly: %s", exc)
            return
        if mismatch is not None:
            logger.warning("CUDA graph replay differs from the eager forward (max abs diff %.3g); "
                           "decode runs eagerly", mismatch)
            return
        self.decode_graphs = graphs
        logger.info("decode graphs ready for batch sizes %s", graphs.sizes)

    def warm_up(self, max_model_len: int) -> int:
        """Launch every kernel variant serving will need (warmup.py); how many compiled."""
        steps = warm_up_steps(max_model_len, self.token_budget, self.num_blocks, self.block_size,
                              eager_decode_splits=self.decode_graphs is None)
        groups = len(self.kv_pool.groups)

        def step(query_lens: list[int], seq_lens: list[int]) -> None:
            run_step(self.model, query_lens, seq_lens, self.block_size, self.num_blocks, groups, self.device)
            if self.lora is not None:
                self.lora.warm_up()  # once: a dummy step's size is no part of its kernels' variants

        return warm_up(step, steps)

    @staticmethod
    def kernel_compiles() -> int:
        """Kernel variants compiled in this process (kernels/compile_counter.py)."""
        return kernel_compiles()

    def compile_decode(self, max_model_len: int) -> None:
        """Decode steps through torch.compile graphs, compiled per bucket on first use (CPU;
        see compiled_forward.py)."""
        from kvdeck.engine.runner.compiled_forward import CompiledDecode

        if self.device.type != "cpu" or self.ops.name != "torch":
            # The compiled graph calls the torch attention as a CPU custom op; on CUDA the
            # Triton kernels' CUDA graphs are the fast path.
            logger.warning("compile_decode runs on CPU with the torch kernels only; decode runs eagerly")
            return
        if len(self.kv_pool.groups) > 1 or any(layer.write_options or layer.attend_options
                                                 for layer in self.attention_layers):
            # The compiled op is plain causal attention over a float cache.
            logger.warning("compile_decode does not cover sliding windows, soft-capped scores or "
                           "an 8-bit KV cache yet; decode runs eagerly")
            return
        self.decode_graphs = CompiledDecode(self.model, self.config.max_num_seqs, max_model_len,
                                            self.block_size, self.model_config.hidden_size, self.dtype,
                                            self.device)

    # ---- one step ------------------------------------------------------------------
    def prepare_inputs(self, batch: BatchPlan, previous: dict[str, int] | None = None) -> StepInputs:
        """Pack the batch into flat tensors on the device (input_batch.py)."""
        inputs = self.input_batch.prepare(batch, previous)
        if self.lora is not None:
            inputs.lora = self.lora.plan(batch.requests, batch.num_new_tokens)
        return inputs

    def launch(self, batch: BatchPlan, previous: LaunchedStep | None = None) -> LaunchedStep:
        """Async scheduling: pack the batch and hand its forward and sampling to the device
        queue; the samples come later (async_step.py). Its decode rows may take their input
        from `previous`'s samples. No grammar masks, no drafts: such steps run `execute`."""
        started = time.perf_counter()
        inputs = self.prepare_inputs(batch, previous.index_of if previous is not None else None)
        inputs.copies = StepCopies.of(batch)
        step = LaunchedStep(inputs.num_requests, list(inputs.sample_batch_index),
                            {r.request_id: i for i, r in enumerate(inputs.sample_requests)},
                            time.perf_counter() - started, started)
        if self.device_queue is None:
            self.device_queue = CudaStream(self.config.max_num_seqs) if self.device.type == "cuda" \
                else SimulatedDevice()

        def work() -> DeviceOutcome:
            if inputs.copies is not None:  # on the queue: after the step before, before this one
                inputs.copies.save_and_swap(self.kv_tier_io, self.kv_swap)
            return self._device_work(inputs, previous)

        return self.device_queue.launch(work, step)

    def _device_work(self, inputs: StepInputs, previous: LaunchedStep | None) -> DeviceOutcome:
        with torch.inference_mode():
            self._apply_cpu_threads()
            if inputs.copies is not None:
                inputs.copies.load(self.kv_tier_io)
            if inputs.placeholder_dst is not None:
                inputs.input_ids.index_copy_(0, inputs.placeholder_dst,
                                             previous.tokens().index_select(0, inputs.placeholder_src))
            hidden = self._forward(inputs)
            if not inputs.sample_rows:
                return DeviceOutcome()
            logits, greedy = self._logits(inputs, hidden, inputs.sample_rows)
            try:
                samples = self.sampler.sample_on_device(logits, inputs.sample_requests, None, greedy)
                return DeviceOutcome(samples)
            except Exception:  # row by row on the host, as `execute` does
                results, failed = self.step_sampler.sample(logits, inputs.sample_requests)
                return DeviceOutcome(host_results=results, failures=failed)

    def _logits(self, inputs: StepInputs, hidden: torch.Tensor,
                rows: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits at `rows`, and their greedy tokens where a decode graph made both."""
        if inputs.graph_logits is not None:
            logits, greedy = inputs.graph_logits
            return _rows_of(logits, rows), _rows_of(greedy, rows)
        return self.model.compute_logits(_rows_of(hidden, rows)), None

    def forget(self, request_id: str) -> None:
        """A request is done: its persistent rows and its sampling state go."""
        self.input_batch.forget(request_id)
        self.sampler.forget(request_id)

    def _apply_cpu_threads(self) -> None:
        """Set the thread count the governor chooses, in the thread that runs the steps (OpenMP's
        count is per calling thread: the native kernels read it there)."""
        if self.cpu_threads is not None:
            threads = self.cpu_threads.threads()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        # Prompt logprobs and embeddings read hidden states: the plain forward gives them.
        graphs = self.decode_graphs if not (inputs.prompt_logprob_spans or inputs.embedding_rows) else None
        if inputs.lora is not None:  # adapter rows: the adapter graphs, else the Python forward, eager
            if graphs is not None and graphs.can_run_lora(inputs.meta, inputs.meta.seq_lens.shape[0]):
                hidden = graphs.run(inputs.input_ids, inputs.positions, inputs.meta,
                                    lora_slots=self.lora.graph_token_slots(inputs.lora))
                inputs.graph_logits = graphs.last_logits() if graphs.with_logits else None
                return hidden
            return self.lora.forward(self.model, inputs.input_ids, inputs.positions, inputs.meta, inputs.lora)
        if (graphs is not None and graphs.can_run(inputs.meta, inputs.meta.seq_lens.shape[0])
                and not native_decode.decoder_stack_takes(self.model, inputs.input_ids)):
            hidden = graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
            inputs.graph_logits = graphs.last_logits() if graphs.with_logits else None
            return hidden
        return self.model(inputs.input_ids, inputs.positions, inputs.meta)

    @torch.inference_mode()
    def execute(self, batch: BatchPlan, token_masks: TokenMasks | None = None,
                draft_probs: dict[str, torch.Tensor] | None = None) -> StepResult:
        """Run the batch; a sample for each request that reached the end of its tokens, and the
        verified run of each speculating request. `token_masks` constrains what some of the
        sampled ones may sample (grammars; a constrained request never speculates);
        `draft_probs`: the q each request's drafts were drawn from, by request id (absent:
        point masses, as an n-gram proposer's)."""
        started = time.perf_counter()
        self._apply_cpu_threads()
        inputs = self.prepare_inputs(batch)
        prepared = time.perf_counter()
        copies = StepCopies.of(batch)
        if copies is not None:  # before the forward writes into blocks they release or fill
            copies.save_and_swap(self.kv_tier_io, self.kv_swap)
            copies.load(self.kv_tier_io)
        hidden = self._forward(inputs)
        results: list[SampleResult | None] = [None] * inputs.num_requests
        failures: dict[int, str] = {}
        prompt_entries = {}
        if inputs.prompt_logprob_spans:
            prompt_entries, failures = prompt_logprobs(self.model.compute_logits, hidden,
                                                       inputs.prompt_logprob_spans, batch.requests)
        embeddings = _embeddings(hidden, inputs.embedding_rows) if inputs.embedding_rows else {}
        spec_samples: dict[int, list[SampleResult]] = {}
        num_plain = len(inputs.sample_rows)
        if num_plain or inputs.spec_rows:
            logits, greedy = self._logits(inputs, hidden, inputs.sample_rows + inputs.spec_rows)
            if num_plain:
                masks = self.step_sampler.mask_rows(token_masks, inputs.sample_batch_index)
                sampled, failed = self.step_sampler.sample(logits[:num_plain], inputs.sample_requests, masks,
                                               greedy[:num_plain] if greedy is not None else None)
                if num_plain == inputs.num_requests:  # every row samples, in batch order
                    results = sampled
                else:
                    for i, result in zip(inputs.sample_batch_index, sampled):
                        results[i] = result
                failures.update({inputs.sample_batch_index[row]: why for row, why in failed.items()})
            if inputs.spec_requests:
                verified, failed = self.step_sampler.verify(logits[num_plain:], inputs.spec_requests,
                                                            draft_probs)
                for i, tokens in zip(inputs.spec_batch_index, verified):
                    if tokens is not None:
                        spec_samples[i] = tokens
                failures.update({inputs.spec_batch_index[row]: why for row, why in failed.items()})
        for index in failures:  # a failed request emits nothing this step
            results[index] = None
            spec_samples.pop(index, None)
            embeddings.pop(index, None)
        return StepResult(results, prepared - started, time.perf_counter() - started, failures,
                          spec_samples, prompt_entries, embeddings)

    @torch.inference_mode()
    def sample_logits(self, batch: BatchPlan) -> tuple[torch.Tensor, list[int]]:
        """Run the batch; the logits at the last token of each sequence that reached its end, and
        those sequences' batch indices (a draft model draws its proposals from these)."""
        self._apply_cpu_threads()
        inputs = self.prepare_inputs(batch)
        hidden = self._forward(inputs)
        return self.model.compute_logits(_rows_of(hidden, inputs.sample_rows)), inputs.sample_batch_index


def _rows_of(hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """hidden's `rows`, in that order; hidden itself when they are all of its rows in order
    (a decode step's: no index tensor, no gather)."""
    if len(rows) == hidden.shape[0] and rows == list(range(len(rows))):
        return hidden
    return hidden[torch.tensor(rows, device=hidden.device)]


def _embeddings(hidden: torch.Tensor, rows: list[tuple[int, int]]) -> dict[int, list[float]]:
    """Batch row -> the L2-normalised final hidden state at its last prompt token (fp32)."""
    vectors = torch.nn.functional.normalize(hidden[[row for _, row in rows]].float(), dim=-1)
    return {index: vector for (index, _), vector in zip(rows, vectors.tolist())}
