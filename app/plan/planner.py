"""`kvdeck plan`'s work, from its options to a report: the model shape, the base engine
choice and its pool (given, from a GPU, or the recording's), the step-cost model, the
workload (synthetic, or a recording's requests), each alternative, and the verdict."""

from dataclasses import dataclass, field, replace

from kvdeck.app.plan.choices import EngineChoice, engine_default_preemption, parse_try, with_changes
from kvdeck.app.plan.cost_model import CostModel, RooflineCostModel
from kvdeck.app.plan.gpus import GPU, find_gpu
from kvdeck.app.plan.model_shapes import QUANTS, ModelShape, find_model_shape
from kvdeck.app.plan.pool import pool_on_gpu
from kvdeck.app.plan.report import Comparison, PlanReport, summarize, verdict
from kvdeck.app.plan.simulate import simulate
from kvdeck.app.plan.workload import Lengths, SyntheticWorkload, Workload

DEFAULT_BUDGET = {"gpu": 8192, "cpu": 2048}  # the engine's max_num_batched_tokens defaults


@dataclass(slots=True)
class PlanOptions:
    recording: str | None = None
    model: str | None = None
    quant: str = "bf16"
    gpu: str | None = None
    gpu_memory_utilization: float = 0.9
    num_blocks: int | None = None
    block_size: int | None = None  # None: the recording's, else 16
    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = None  # None: the recording's, else the engine's 256
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # --context
    enable_prefix_caching: bool = True
    preemption_mode: str | None = None  # None: the engine's default
    swap_space_gib: float = 4.0
    users: int | None = None  # a synthetic workload (with a recording: its step costs only)
    turns: int = 1
    prompt_len: str | None = None  # default: what fills max_model_len over the turns
    turn_len: str = "128"
    output_len: str = "256"
    shared_prefix: int = 0
    rate: float | None = None
    ramp_s: float = 0.0
    think_time_s: float = 0.0
    seed: int = 0
    tries: list[str] = field(default_factory=list)
    ttft_slo_s: float | None = None
    # Step costs measured elsewhere (kvdeck plan --calibrate: the real engine on this machine);
    # used unless --gpu asks for the roofline.
    cost_model: CostModel | None = None


@dataclass(slots=True)
class _Setup:
    shape: ModelShape
    gpu: GPU | None
    base: EngineChoice
    cost: CostModel


def plan(options: PlanOptions) -> PlanReport:
    """Run every choice; ValueError naming the problem on bad options or a bad file."""
    if options.quant not in QUANTS:
        raise ValueError(f"unknown quantisation {options.quant!r}; known: {', '.join(QUANTS)}")
    session = None
    if options.recording is not None:
        from kvdeck.app.plan.recording import load_session

        session = load_session(options.recording)
    setup = _base_setup(options, session)
    workload = _workload(options, setup, session)
    choices = [(setup.base, setup.cost)]
    for text in options.tries:
        choices.append(_alternative(options, setup, parse_try(text), text))
    summaries = []
    results = []
    sample_times = session.snapshot_times if session is not None and not options.users else ()
    for choice, cost in choices:
        result = simulate(workload, choice, cost, setup.shape.vocab_size, sample_times=sample_times)
        results.append(result)
        summaries.append(summarize(result, cost.description))
    report = PlanReport(workload.description, summaries)
    context = options.max_model_len if session is None or options.users else None
    blocks_per_context = setup.shape.blocks_per_context(context, setup.base.block_size) \
        if context else None
    report.verdict = verdict(summaries[0], options.users, context, blocks_per_context,
                             options.ttft_slo_s)
    if session is not None and not options.users:
        recorded_choice = _is_recorded_choice(setup.base, session)
        by_step = simulate(workload, setup.base, setup.cost, setup.shape.vocab_size, by_step=True) \
            if session.replays_by_step and recorded_choice else None
        report.comparisons = session.compare(results[0], by_step)
        report.notes += session.notes + _unjudged(report.comparisons, setup, session, recorded_choice)
    if isinstance(workload, SyntheticWorkload) and workload.num_cut_short:
        report.notes.append(f"{workload.num_cut_short} conversations ended early: their next turn "
                            f"would pass max_model_len {setup.base.max_model_len}")
    return report


def _base_setup(options: PlanOptions, session) -> _Setup:
    if options.model is not None:
        shape = find_model_shape(options.model)
    elif session is not None:
        shape = session.shape
    else:
        shape = find_model_shape("demo")
    gpu = find_gpu(options.gpu) if options.gpu is not None else None
    budget = options.max_num_batched_tokens or (
        session.engine.max_num_batched_tokens if session is not None and
        session.engine.max_num_batched_tokens else DEFAULT_BUDGET["gpu" if gpu else "cpu"])
    recorded = session.engine if session is not None else None
    max_num_seqs = options.max_num_seqs or (recorded and recorded.max_num_seqs) or 256
    block_size = options.block_size or (recorded and recorded.block_size) or 16
    note = ""
    if options.num_blocks is not None:
        num_blocks = options.num_blocks
    elif gpu is not None:
        pool = pool_on_gpu(gpu, shape, options.quant, options.kv_cache_dtype, block_size,
                           options.gpu_memory_utilization, budget, max_num_seqs)
        num_blocks, note = pool.num_blocks, pool.describe(gpu, options.gpu_memory_utilization)
    elif recorded is not None and recorded.num_blocks and recorded.block_size:
        # The recorded pool's memory, in blocks of this size.
        num_blocks = recorded.num_blocks * recorded.block_size // block_size
        note = "the recorded engine's pool" + (
            f" ({recorded.num_blocks} blocks of {recorded.block_size})"
            if block_size != recorded.block_size else "")
    else:
        raise ValueError("no KV pool size: give --gpu NAME (sized from the card), --num-blocks N, "
                         "or a recording")
    max_model_len = options.max_model_len or (
        session.engine.max_model_len if session is not None and session.engine.max_model_len
        else min(shape.max_position_embeddings, num_blocks * block_size))
    if max_model_len > shape.max_position_embeddings:
        raise ValueError(f"context {max_model_len} exceeds {shape.name}'s max_position_embeddings "
                         f"{shape.max_position_embeddings}")
    if shape.blocks_per_context(max_model_len, block_size) > num_blocks:
        raise ValueError(
            f"one {max_model_len}-token request needs {shape.blocks_per_context(max_model_len, block_size)} "
            f"blocks and the pool holds {num_blocks}{' (' + note + ')' if note else ''}: the engine "
            "would refuse this max_model_len; lower --context or give more memory")
    prefix = options.enable_prefix_caching
    if session is not None and session.engine.enable_prefix_caching is not None and prefix:
        prefix = session.engine.enable_prefix_caching
    base = EngineChoice("base", num_blocks, block_size, max_num_seqs, budget, max_model_len,
                        prefix, options.kv_cache_dtype, _group_windows(shape), note,
                        options.preemption_mode or engine_default_preemption(),
                        options.swap_space_gib,
                        shape.kv_bytes_per_block(block_size, options.kv_cache_dtype))
    if gpu is not None:
        cost: CostModel = RooflineCostModel(gpu, shape, options.quant, options.kv_cache_dtype)
    elif options.cost_model is not None:
        cost = options.cost_model
    elif session is not None:
        cost = session.cost_model
    else:
        raise ValueError("no step-cost model: give --gpu NAME (a roofline for --model), a "
                         "recording to fit one on, or --calibrate (time the real engine here)")
    return _Setup(shape, gpu, base, cost)


def _group_windows(shape: ModelShape) -> tuple[int | None, ...]:
    return tuple(group.window for group in shape.kv_groups())


def _alternative(options: PlanOptions, setup: _Setup, changes: dict, label: str,
                 ) -> tuple[EngineChoice, CostModel]:
    choice = with_changes(setup.base, changes, label)
    choice = replace(choice, block_bytes=setup.shape.kv_bytes_per_block(choice.block_size,
                                                                        choice.kv_cache_dtype))
    gpu = find_gpu(str(changes["gpu"])) if "gpu" in changes else setup.gpu
    resized = {"gpu", "block_size", "kv_cache_dtype", "max_num_batched_tokens", "max_num_seqs"}
    if gpu is not None and "num_blocks" not in changes and resized & set(changes):
        pool = pool_on_gpu(gpu, setup.shape, options.quant, choice.kv_cache_dtype,
                           choice.block_size, options.gpu_memory_utilization,
                           choice.max_num_batched_tokens, choice.max_num_seqs)
        choice = replace(choice, num_blocks=pool.num_blocks,
                         pool_note=pool.describe(gpu, options.gpu_memory_utilization))
    elif "block_size" in changes and "num_blocks" not in changes:  # the same memory
        choice = replace(choice, num_blocks=setup.base.num_blocks * setup.base.block_size
                         // choice.block_size)
    cost = setup.cost
    if gpu is not None and ("gpu" in changes or "kv_cache_dtype" in changes):
        # gpu= on a fitted base: the same workload on that card's roofline.
        cost = RooflineCostModel(gpu, setup.shape, options.quant, choice.kv_cache_dtype)
    return choice, cost


def _workload(options: PlanOptions, setup: _Setup, session) -> Workload:
    if session is not None and not options.users:
        return session.workload
    users = options.users or 1
    output = Lengths.parse(options.output_len, "--output-len")
    turn = Lengths.parse(options.turn_len, "--turn-len")
    if options.prompt_len is not None:
        prompt = Lengths.parse(options.prompt_len, "--prompt-len")
    else:  # the last turn fills the context
        fill = setup.base.max_model_len - options.shared_prefix - options.turns * output.high \
            - (options.turns - 1) * turn.high
        if fill <= 0:
            raise ValueError(f"{options.turns} turns of {output} output tokens (+{turn} each "
                             f"later turn) do not fit in a {setup.base.max_model_len}-token "
                             "context; give --prompt-len or fewer --turns")
        prompt = Lengths(fill, fill)
    return SyntheticWorkload(
        users=users, prompt_len=prompt, output_len=output, vocab_size=setup.shape.vocab_size,
        max_model_len=setup.base.max_model_len, turns=options.turns, turn_len=turn,
        shared_prefix=options.shared_prefix, rate=options.rate, ramp_s=options.ramp_s,
        think_time_s=options.think_time_s, seed=options.seed)


def _unjudged(comparisons: list[Comparison], setup: _Setup, session,
              recorded_choice: bool) -> list[str]:
    """Leave unjudged (shown only) what the recording cannot check: a named card's timings
    against a CPU recording, and the pool's figures when the base choice's pool or scheduler
    is not the recorded engine's. The notes say why."""
    notes = []
    device = session.engine.device or "an unknown device"
    if setup.gpu is not None and not device.startswith("cuda"):
        _shown_only(comparisons, lambda c: c.name.startswith(("TTFT", "ITL")))
        notes.append(f"TTFT and ITL are predicted for the {setup.gpu.name} and were recorded on "
                     f"{device}: shown, not judged")
    if not recorded_choice:
        _shown_only(comparisons, lambda c: not c.name.startswith(("TTFT", "ITL")))
        notes.append("the base choice's pool or scheduler is not the recorded engine's: its KV "
                     "blocks, preemptions and steps are shown, not judged")
    return notes


def _shown_only(comparisons: list[Comparison], which) -> None:
    for index, comparison in enumerate(comparisons):
        if which(comparison):
            comparisons[index] = replace(comparison, tolerance=None)


def _is_recorded_choice(choice: EngineChoice, session) -> bool:
    """Whether `choice` is the recorded engine's scheduler and pool (a replay by step means
    nothing for another)."""
    engine = session.engine
    recorded = (engine.num_blocks, engine.block_size, engine.max_num_seqs,
                engine.max_num_batched_tokens, engine.enable_prefix_caching)
    return None not in recorded and recorded == (
        choice.num_blocks, choice.block_size, choice.max_num_seqs, choice.max_num_batched_tokens,
        choice.enable_prefix_caching)
