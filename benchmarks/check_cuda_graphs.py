"""CUDA-graph decode on a real GPU: the same greedy tokens as eager, and the decode speed-up.

    python benchmarks/check_cuda_graphs.py --out benchmarks/results/cuda_graphs_<gpu>.json

1. Correctness: the bundled demo model, greedy, 8 prompts x 64 tokens, graphs vs
   `enforce_eager=True`; every token must match. Both engines have LoRA on (two random
   adapters, benchmarks/lora_adapters.py): the prompts run on the base (the plain graphs),
   then again mixing the two adapters and the base (the adapter graphs against the eager
   adapter forward); every token must match there too.
2. Speed: the Qwen3-0.6B config with dummy bf16 weights, decode-heavy batches of 1, 8 and
   64 requests (16-token prompts, 256 new tokens), output tokens/s with graphs and eager
   in the same run, and their ratio.

Exit status 1 when graphs were not captured or tokens differ, 2 without CUDA. The JSON is
rewritten after each part. `--smoke --model DIR`: the same on the CPU with a tiny model, the
graphs' static buffers replayed eagerly (the GPU battery's CPU test; no figure).
"""

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvdeck import LLM, LoRARequest, SamplingParams
from kvdeck.app.bench.result import build_result, write_json_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lora_adapters import write_random_adapter  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

QWEN3_CONFIG = REPO / "benchmarks" / "configs" / "qwen3-0.6b" / "config.json"
GPU_MEMORY_UTILIZATION = 0.4  # two engines are built one after the other


def _engine(model: str | None, enforce_eager: bool, smoke: bool, **kwargs) -> LLM:
    """An engine; on the CPU (--smoke) its decode graphs are the static-buffer path replayed
    eagerly, since CUDA graphs need CUDA."""
    if smoke:
        llm = LLM(model, enforce_eager=enforce_eager, device="cpu", kv_cache_memory_gib=0.01,
                  seed=0, **{k: v for k, v in kwargs.items() if k != "gpu_memory_utilization"})
        if not enforce_eager:
            llm.engine.core.runner.capture_decode_graphs(llm.engine.core.max_model_len, capture=False)
        return llm
    return LLM(model, enforce_eager=enforce_eager, seed=0, **kwargs)


def greedy_tokens(enforce_eager: bool, prompts: list[list[int]], model: str | None = None,
                  smoke: bool = False, loras: list | None = None) -> tuple[list[list[int]], bool, list, int]:
    """The base's greedy tokens, whether graphs were captured, the tokens under `loras` (one
    per prompt, None: the base) and how many adapter steps replayed the adapter graphs."""
    # `with`: the engine's memory is freed on leaving, so the next engine profiles a free card.
    with _engine(model, enforce_eager, smoke, gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                 enable_lora=True, max_loras=2, max_lora_rank=16) as llm:
        captured = llm.engine.core.runner.decode_graphs is not None if smoke else llm.engine.info.cuda_graphs
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, detokenize=False)
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        manager, graph_steps = llm.engine.core.runner.lora, []
        graph_slots = manager.graph_token_slots
        manager.graph_token_slots = lambda plan: (graph_steps.append(1), graph_slots(plan))[1]
        with_loras = [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora_request=loras)]
    return tokens, captured, with_loras, len(graph_steps)


def _model_dir(model: str | None) -> Path:
    from kvdeck.engine.types.model_path import resolve_model_path

    path = Path(resolve_model_path(model))
    return path.parent if path.is_file() else path


def decode_throughput(enforce_eager: bool, batch_sizes: list[int], model: str | None = None,
                      smoke: bool = False, on_batch=None) -> dict[int, float]:
    model = model or str(QWEN3_CONFIG)
    dtype = "float32" if smoke else "bfloat16"
    with _engine(model, enforce_eager, smoke, load_format="dummy", dtype=dtype,
                 gpu_memory_utilization=GPU_MEMORY_UTILIZATION) as llm:
        return _decode_throughput(llm, "eager" if enforce_eager else "graphs", batch_sizes,
                                  8 if smoke else 256, on_batch)


def _decode_throughput(llm: LLM, label: str, batch_sizes: list[int], max_tokens: int,
                       on_batch=None) -> dict[int, float]:
    rng = random.Random(0)
    vocab = llm.engine.info.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    figures = {}
    for batch in batch_sizes:
        prompts = [[rng.randrange(vocab) for _ in range(16)] for _ in range(batch)]
        llm.generate(prompts[:1], SamplingParams(max_tokens=4, detokenize=False))  # warm-up
        _synchronize()
        started = time.perf_counter()
        outputs = llm.generate(prompts, params)
        _synchronize()
        elapsed = time.perf_counter() - started
        figures[batch] = sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed
        print(f"  {label} batch {batch:3d}: {figures[batch]:9.1f} tok/s", flush=True)
        if on_batch is not None:
            on_batch(label, batch, figures[batch])
    return figures


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON result here (after each part)")
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--smoke", action="store_true", help="the CPU form: tiny model, no figure")
    parser.add_argument("--model", default=None, help="--smoke: the tiny model (both parts)")
    args = parser.parse_args()
    if args.smoke and args.model is None:
        parser.error("--smoke needs --model")
    if not args.smoke and not torch.cuda.is_available():
        print("CUDA graphs need a CUDA GPU", file=sys.stderr)
        return 2
    batch_sizes = [int(b) for b in ("1,2" if args.smoke else args.batch_sizes).split(",")]
    config = {"correctness_model": args.model or "demo",
              "speed_model": args.model or str(QWEN3_CONFIG.relative_to(REPO)),
              "speed_dtype": "float32" if args.smoke else "bfloat16", "prompt_tokens": 16,
              "output_tokens": 8 if args.smoke else 256, "smoke": args.smoke}
    figures: dict = {"decode_tokens_per_s": {}}

    def save() -> None:
        if args.out:
            write_json_atomic(Path(args.out), build_result("cuda_graphs", config, figures))

    def on_batch(label: str, batch: int, tokens_per_s: float) -> None:
        row = figures["decode_tokens_per_s"].setdefault(str(batch), {})
        row[label] = tokens_per_s
        if "graphs" in row and "eager" in row:
            row["ratio"] = row["graphs"] / row["eager"]
        save()

    rng = random.Random(1)
    prompts = [[rng.randrange(4096 if not args.smoke else 200) for _ in range(rng.randint(8, 200))]
               for _ in range(8 if not args.smoke else 3)]
    with tempfile.TemporaryDirectory() as tmp:
        adapters = [LoRARequest(f"check{i}", i + 1, str(write_random_adapter(
            _model_dir(args.model), Path(tmp) / f"a{i}", rank, seed=i, scale=0.2)))
            for i, rank in enumerate((8, 16))]
        loras = [adapters[0], None, adapters[1]] * 3
        loras = loras[: len(prompts)]
        with_graphs, captured, graphs_lora, graph_steps = greedy_tokens(False, prompts, args.model,
                                                                        args.smoke, loras)
        eager, _, eager_lora, _ = greedy_tokens(True, prompts, args.model, args.smoke, loras)
    matching = sum(a == b for a, b in zip(with_graphs, eager))
    lora_matching = sum(a == b for a, b in zip(graphs_lora, eager_lora))
    print(f"graphs captured: {captured}; greedy sequences equal to eager: {matching}/{len(prompts)}; "
          f"with adapters: {lora_matching}/{len(prompts)} ({graph_steps} adapter steps on adapter graphs)",
          flush=True)
    figures.update(graphs_captured=captured, greedy_sequences_equal=matching, greedy_sequences=len(prompts),
                   lora_greedy_sequences_equal=lora_matching, lora_adapter_graph_steps=graph_steps,
                   lora_changes_tokens=graphs_lora != with_graphs)
    save()
    decode_throughput(False, batch_sizes, args.model, args.smoke, on_batch)
    decode_throughput(True, batch_sizes, args.model, args.smoke, on_batch)
    if args.out:
        print(f"wrote {args.out}")
    lora_ok = lora_matching == len(prompts) and graph_steps > 0
    return 0 if captured and matching == len(prompts) and lora_ok else 1


if __name__ == "__main__":
    sys.exit(main())
