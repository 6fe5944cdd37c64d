"""`kvdeck bench throughput` and `kvdeck bench decode`: the engine in this process against a
baseline in the same run (the runners are kvdeck.app.bench's), the figures printed and written
as JSON."""

import argparse
import sys
from pathlib import Path

from kvdeck.app.cli.engine_flags import engine_kwargs_from_args


def _grounded_prompts():
    from kvdeck.app.bench.grounded import grounded_prompts

    return grounded_prompts


def _agentic_prompts():
    from kvdeck.app.bench.agentic import agentic_prompts

    return agentic_prompts


def _chat_prompts():
    from kvdeck.app.bench.chat import chat_prompts

    return chat_prompts


# The workloads of token prompts made from text: (tokenizer, num, input_len, seed) -> prompts.
TEXT_WORKLOADS = {"grounded": _grounded_prompts, "agentic": _agentic_prompts, "chat": _chat_prompts}


def run_throughput(args: argparse.Namespace) -> int:
    import gc

    import torch

    from kvdeck.app.bench.plot import PlotUnavailable, plot_throughput
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.app.bench.throughput import (
        WARMUP_OUTPUT_LEN,
        WARMUP_REQUESTS,
        median_run,
        parse_range,
        run_hf_baseline,
        run_kvdeck,
        warm_up_kvdeck,
    )
    from kvdeck.engine.api.llm import LLM
    from kvdeck.engine.types.model_path import resolve_model_path

    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    input_len = parse_range(args.input_len, "--input-len")
    output_len = parse_range(args.output_len, "--output-len")
    args.seed = args.seed if args.seed is not None else 0
    engine_kwargs = engine_kwargs_from_args(args)
    from kvdeck.engine.types.model_config import read_model_config

    model_config = read_model_config(resolve_model_path(args.model))
    if not args.prompts_file:
        # The workload's longest request: the length a contiguous allocator would reserve.
        limit = model_config.max_position_embeddings
        engine_kwargs.setdefault("max_model_len", min(limit, input_len[1] + output_len[1]))
    speculative = engine_kwargs.get("speculative_config") is not None
    if speculative and args.baseline != "none":
        raise ValueError("--speculative-config compares with the same engine without speculation; "
                         f"leave out --baseline {args.baseline}")
    if args.baseline == "llama.cpp":
        _choose_gguf(args)
    llm = LLM(args.model, **engine_kwargs)
    info = llm.engine.info
    requests = _workload(args, llm, input_len, output_len)
    print(f"kvdeck: {len(requests)} requests on {Path(info.model_dir).name} "
          f"({info.device}, {info.dtype}, {info.num_blocks} KV blocks)", file=sys.stderr)
    warm_up_kvdeck(llm, requests)

    baseline_config: dict | str = args.baseline
    if speculative:
        from kvdeck.app.bench.speculative import compare_throughput, print_comparison, without_speculation

        plain = LLM(args.model, **without_speculation(engine_kwargs))
        warm_up_kvdeck(plain, requests)
        figures = compare_throughput(plain, llm, requests, args.repeats, run_kvdeck, median_run)
        _print_line("spec", figures["kvdeck"])
        _print_line("plain", figures["baseline"])
        print_comparison("throughput", figures)
    elif args.baseline == "llama.cpp":
        from kvdeck.app.bench.against_llama_cpp import throughput_pairs

        figures, command = throughput_pairs(args, llm, requests, torch.get_num_threads())
        baseline_config = _llama_cpp_config(args, command)
        _print_line("kvdeck", figures["kvdeck"])
        _print_line("llama.cpp", figures["baseline"])
        pairs = figures["ratio_pairs"]
        print(f"ratio (kvdeck / llama.cpp, output tokens/s): median {pairs['median']:.2f}x over "
              f"{len(pairs['pairs'])} pairs ({pairs['min']:.2f}-{pairs['max']:.2f})")
    else:
        kvdeck = median_run([run_kvdeck(llm, requests) for _ in range(args.repeats)])
        figures = {"kvdeck": kvdeck}
        _print_line("kvdeck", kvdeck)
    if args.baseline == "hf":
        llm.shutdown()  # the engine's memory (the GPU's, on CUDA) goes back first
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        device = "cuda" if torch.cuda.is_available() and engine_kwargs.get("device") != "cpu" else "cpu"
        batch_size = args.baseline_batch_size or _baseline_batch_size(device, len(requests))
        runs = run_hf_baseline(resolve_model_path(args.model), requests, batch_size, device,
                               "float32" if device == "cpu" else "bfloat16",
                               dummy=engine_kwargs.get("load_format") == "dummy", repeats=args.repeats)
        figures["baseline"] = {"name": "hf-transformers-generate", **median_run(runs)}
        figures["ratio"] = kvdeck["output_tokens_per_s"] / figures["baseline"]["output_tokens_per_s"]
        _print_line("hf", figures["baseline"])
        print(f"ratio (kvdeck / hf, output tokens/s): {figures['ratio']:.2f}x")
    config = {
        "model": args.model or "demo", "num_prompts": args.num_prompts,
        "input_len": list(input_len), "output_len": list(output_len), "seed": args.seed,
        "engine": engine_kwargs, "prompts_file": args.prompts_file,
        # What sets two runs of one shape apart (bf16 against AWQ INT4, run_gpu.sh's throughput).
        "quantization_config": model_config.quantization_config,
        "weight_bytes_per_token": info.weight_bytes_per_token,
        "warmup": f"{WARMUP_REQUESTS} requests of <= {WARMUP_OUTPUT_LEN} tokens, untimed, on each side",
        "repeats": args.repeats, "threads": torch.get_num_threads(), "baseline": baseline_config,
        "workload": args.workload,
    }
    result = build_result("throughput", config, figures, argv=args._argv)
    if args.out:
        write_json_atomic(args.out, result)
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot and not speculative:
        try:
            plot_throughput(result, args.plot)
        except PlotUnavailable as exc:
            print(f"bench: {exc}", file=sys.stderr)
    return 0


def run_decode(args: argparse.Namespace) -> int:
    import random

    import torch

    from kvdeck.app.bench.decode import run_decode_benchmark
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.engine.api.llm import LLM

    if args.input_len < 1:
        raise ValueError(f"--input-len must be positive, got {args.input_len}")
    engine_kwargs = engine_kwargs_from_args(args)
    engine_kwargs.setdefault("max_num_seqs", 1)
    engine_kwargs.setdefault("max_model_len", args.input_len + args.output_len)
    if engine_kwargs.get("speculative_config") is not None and args.baseline != "none":
        raise ValueError("--speculative-config compares with the same engine without speculation; "
                         f"leave out --baseline {args.baseline}")
    contention = None
    if args.contention:
        from kvdeck.app.bench.contention import Contention, busy_cpus

        if engine_kwargs.get("speculative_config") is not None:
            raise ValueError("--contention measures one engine quiet and busy; leave out "
                             "--speculative-config")
        contention = Contention(busy_cpus(args.contention))
    if args.baseline != "none":
        _choose_gguf(args)
    llm = LLM(args.model, **engine_kwargs)
    info = llm.engine.info
    seed = args.seed if args.seed is not None else 0
    if args.workload in TEXT_WORKLOADS:
        prompts = TEXT_WORKLOADS[args.workload]()(llm.get_tokenizer(), max(1, args.repeats),
                                                  args.input_len, seed)
    else:
        rng = random.Random(seed)
        prompts = [[rng.randrange(info.vocab_size) for _ in range(args.input_len)]]
    if engine_kwargs.get("speculative_config") is not None:
        config = {"model": args.model or "demo", "input_len": args.input_len,
                  "output_len": args.output_len, "repeats": args.repeats, "engine": engine_kwargs,
                  "graphs": info.cuda_graphs, "threads": torch.get_num_threads(),
                  "workload": args.workload}
        return _run_decode_comparison(args, llm, prompts, config)
    prompt = prompts[0]
    server = baseline = command = None
    try:
        if args.baseline == "llama.cpp":
            from kvdeck.app.bench.against_llama_cpp import decode_baseline

            server, baseline = decode_baseline(args, prompt, args.output_len, torch.get_num_threads(),
                                               info.kv_cache_dtype)
            command = server.command
        elif args.baseline == "llama-bench":
            from kvdeck.app.bench import llama_bench

            bench, baseline = llama_bench.decode_baseline(args, len(prompt), args.output_len,
                                                          torch.get_num_threads(), info.kv_cache_dtype)
            command = bench.command
        figures = run_decode_benchmark(llm, prompt, args.output_len, args.repeats, baseline, contention)
    finally:
        if server is not None:
            server.stop()
    print(f"decode, batch 1, {Path(info.model_dir).name} ({info.device}, {info.dtype}): "
          f"{figures['time_per_output_token_s'] * 1e3:.3f} ms/token "
          f"({figures['output_tokens_per_s']:.1f} tok/s, median of {args.repeats})")
    print(f"  roofline: {figures['bytes_per_token'] / 1e6:.1f} MB/token (weights "
          f"{figures['weight_bytes_per_token'] / 1e6:.1f} MB + KV at {figures['mean_context_tokens']:.0f} "
          f"tokens) / copy bandwidth {figures['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s = "
          f"{figures['roofline_time_per_output_token_s'] * 1e3:.3f} ms/token")
    in_cache = ("; the weights fit in the last-level cache"
                if figures["weights_fit_in_last_level_cache"] else "")
    print(f"  {figures['roofline_fraction']:.1%} of the roofline (DRAM{in_cache})")
    if "baseline" in figures:
        ratio = figures["ratio"]
        name = "llama-bench" if args.baseline == "llama-bench" else "llama.cpp"
        common = figures.get("greedy_tokens_in_common")
        greedy = (f"; greedy tokens in common {common}/{args.output_len}" if common is not None
                  else " (llama-bench returns no tokens to compare)")
        print(f"{name}: {figures['baseline']['time_per_output_token_s'] * 1e3:.3f} ms/token; kvdeck / "
              f"{name} tokens/s: median {ratio['median']:.3f}x over {len(ratio['pairs'])} pairs "
              f"({ratio['min']:.3f}-{ratio['max']:.3f}){greedy}")
    if "contention" in figures:
        name = "llama-bench" if args.baseline == "llama-bench" else "llama.cpp"
        _print_contention(figures["contention"], name)
    config = {"model": args.model or "demo", "input_len": args.input_len,
              "output_len": args.output_len, "repeats": args.repeats, "engine": engine_kwargs,
              "graphs": info.cuda_graphs, "threads": torch.get_num_threads(),
              "baseline": _llama_cpp_config(args, command) if command is not None else "none",
              "workload": args.workload, "contention": args.contention}
    result = build_result("decode", config, {"decode": figures}, argv=args._argv)
    if args.out:
        write_json_atomic(args.out, result)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _print_contention(contention: dict, baseline_name: str) -> None:
    cpus = ", ".join(str(cpu) for cpu in contention["busy_cpus"])
    print(f"with {contention['busy_processes']} other busy process(es) (CPU {cpus}), "
          "busy / quiet tokens/s:")
    for side, name in (("kvdeck", "kvdeck"), ("baseline", baseline_name)):
        if side not in contention:
            continue
        figures = contention[side]
        ratio = figures["busy_over_quiet"]
        print(f"  {name}: {figures['quiet_output_tokens_per_s']:.1f} -> "
              f"{figures['busy_output_tokens_per_s']:.1f} tok/s, median {ratio['median']:.1%} of quiet "
              f"over {len(ratio['pairs'])} repeats ({ratio['min']:.1%}-{ratio['max']:.1%})")


def _run_decode_comparison(args: argparse.Namespace, spec, prompts: list[list[int]], config: dict) -> int:
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.app.bench.speculative import compare_decode, print_comparison, without_speculation
    from kvdeck.engine.api.llm import LLM

    if args.output_len < 2 or args.repeats < 1:
        raise ValueError("--output-len must be >= 2 and --repeats >= 1")
    plain = LLM(args.model, **without_speculation(config["engine"]))
    figures = compare_decode(plain, spec, prompts, args.output_len, args.repeats)
    for name, side in (("plain", figures["baseline"]), ("spec", figures["speculative"])):
        print(f"{name:>5}: {side['time_per_output_token_s'] * 1e3:.3f} ms/token "
              f"({1 / side['time_per_output_token_s']:.1f} tok/s, median of {args.repeats})")
    print_comparison("decode, batch 1", figures)
    if not figures["greedy_outputs_identical"]:
        print("warning: greedy outputs differ between the two sides", file=sys.stderr)
    result = build_result("decode", config, figures, argv=args._argv)
    if args.out:
        write_json_atomic(args.out, result)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _choose_gguf(args: argparse.Namespace) -> None:
    """--llama-cpp-gguf, or an INT4 model's nearest 4-bit GGUF, said on stderr (and set on args
    with its type, for the server, llama-bench and the JSON)."""
    from kvdeck.app.bench.baseline_gguf import choose_baseline_gguf
    from kvdeck.engine.types.model_path import resolve_model_path

    chosen = choose_baseline_gguf(args, resolve_model_path(args.model))
    args.llama_cpp_gguf = str(chosen.path)
    args.llama_cpp_gguf_type = chosen.quantization
    args.llama_cpp_gguf_chosen_because = chosen.chosen_because
    print(f"llama.cpp baseline: {chosen.path} ({chosen.quantization or 'type unknown'}; "
          f"{chosen.chosen_because})", file=sys.stderr)


def _llama_cpp_config(args: argparse.Namespace, command: list[str]) -> dict:
    """What ran on the baseline's side: the tool, its GGUF (type, why that file) and command."""
    return {"name": "llama.cpp", "tool": Path(command[0]).name if command else None,
            "gguf": str(args.llama_cpp_gguf), "gguf_type": getattr(args, "llama_cpp_gguf_type", None),
            "gguf_chosen_because": getattr(args, "llama_cpp_gguf_chosen_because", None),
            "llama_cpp_args": list(args.llama_cpp_args or []),
            "repack": getattr(args, "llama_cpp_repack", None), "command": command}


def _workload(args: argparse.Namespace, llm, input_len: tuple[int, int],
              output_len: tuple[int, int]) -> list:
    from kvdeck.app.bench.throughput import BenchRequest, requests_from_file, synthetic_requests

    if args.workload in TEXT_WORKLOADS:
        import random

        prompts = TEXT_WORKLOADS[args.workload]()
        rng = random.Random(args.seed)
        lengths = [rng.randint(*input_len) for _ in range(args.num_prompts)]
        return [BenchRequest(prompts(llm.get_tokenizer(), 1, n, args.seed + i)[0],
                             rng.randint(*output_len)) for i, n in enumerate(lengths)]
    if args.prompts_file:
        return requests_from_file(args.prompts_file, llm.get_tokenizer(), output_len, args.seed,
                                  args.num_prompts)
    return synthetic_requests(args.num_prompts, input_len, output_len,
                              llm.engine.info.vocab_size, args.seed)


def _baseline_batch_size(device: str, num_requests: int) -> int:
    # On CPU memory is no limit for the tiny models benchmarked there; on GPU, transformers'
    # static cache grows with batch x length, so stay at a size that fits an 80 GB card.
    return min(num_requests, 64 if device == "cpu" else 128)


def _print_line(name: str, figures: dict) -> None:
    print(f"{name:>9}: {figures['output_tokens_per_s']:9.1f} output tok/s  "
          f"{figures['total_tokens_per_s']:9.1f} total tok/s  "
          f"{figures['requests_per_s']:7.2f} req/s  ({figures['elapsed_s']:.1f} s)")
    if "kv_waste_at_peak" in figures:
        print(f"         peak KV usage {figures['peak_kv_usage']:.1%}, KV waste at peak "
              f"{figures['kv_waste_at_peak']:.2%} (contiguous max-length allocation: "
              f"{figures['contiguous_kv_waste_at_peak']:.1%}), preemptions "
              f"{figures['preemptions']}, prefix-cache hit rate {figures['prefix_cache_hit_rate']:.1%}")
        host = {name: seconds * 1e3 for name, seconds in figures["host_work_per_step_s"].items()}
        print(f"         host work {host['total']:.3f} ms/step (schedule {host['schedule']:.3f}, prepare "
              f"inputs {host['prepare_inputs']:.3f}, update {host['update_outputs']:.3f}, front-end "
              f"{host['frontend']:.3f}), {figures['host_overhead_share']:.1%} of step time")
