"""Multi-LoRA decode cost on the CPU: a batch of 64 requests mixing 4 adapters and
the base against the same batch on the base alone, decode step time, on the torch path.

    python benchmarks/bench_lora_mix.py --out benchmarks/results/lora_mix_demo_cpu.json
    python benchmarks/bench_lora_mix.py --tiny-llama --out benchmarks/results/lora_mix_tiny_cpu.json

One engine (enable_lora, max_loras 4) serves both sides, so both run the Python forward
(KVDECK_CPU_NATIVE=0: the CPU decoder stack, which a step with adapter rows cannot take,
is off for the base side too). PEFT adapters of rank `--rank` on every projection (q/k/v/o,
gate/up/down), random non-zero B, are made for the model in a temporary folder. A run adds
`--requests` requests of `--prompt-len` random tokens (mixed: request i uses adapter i % 5,
the fifth being the base), steps until every request decodes, then times `--steps` decode
steps (the core's step: packing, forward, sampling) and takes their median. Runs alternate
base, mixed, base, mixed ... (`--pairs` of each); the figure is the median of the per-pair
mixed / base ratios. The target: <= 1.3. The machine's load average is in the JSON.
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

os.environ["KVDECK_CPU_NATIVE"] = "0"  # before kvdeck loads: both sides on the Python forward
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGET_RATIO = 1.3


def make_adapter(model_dir: Path, out: Path, rank: int, seed: int) -> Path:
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                                  init_lora_weights=False))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    peft_model.save_pretrained(out)
    return out


def decode_step_s(llm, prompts: list[list[int]], loras: list, steps: int) -> float:
    """The median core step time of `steps` decode steps of the batch."""
    from kvdeck import SamplingParams

    engine = llm.engine
    core = engine.core
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    ids = [engine.add_request(None, p, params, lora_request=lora) for p, lora in zip(prompts, loras)]
    while any(not r.output_token_ids for r in core.requests.values()):
        engine.step()  # prefill (chunked) until every request decodes
    times = []
    for _ in range(steps):
        engine.step()
        assert core.last_step.num_seqs == len(prompts) and core.last_step.prefill_tokens == 0
        times.append(core.last_step.duration_s)
    engine.abort_request(ids)
    engine.reset_prefix_cache()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model folder (default: the bundled demo)")
    parser.add_argument("--tiny-llama", action="store_true",
                        help="the tests' tiny random Llama (hidden 64, 2 layers; tests/model_factory.py)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    from kvdeck import LLM, LoRARequest
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.engine.types.model_path import resolve_model_path

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny_llama:
            from tests.model_factory import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "tiny-llama", "llama")
        else:
            model_dir = resolve_model_path(args.model)
        folders = [make_adapter(model_dir, Path(tmp) / f"a{i}", args.rank, i) for i in range(args.adapters)]
        loras = [LoRARequest(f"adapter{i}", i + 1, str(folder)) for i, folder in enumerate(folders)]
        llm = LLM(str(model_dir), enable_lora=True, max_loras=args.adapters, max_lora_rank=max(16, args.rank))
        vocab = llm.get_tokenizer().vocab_size
        rng = random.Random(0)
        mixed_loras = [None if i % (args.adapters + 1) == args.adapters else loras[i % (args.adapters + 1)]
                       for i in range(args.requests)]
        base_loras = [None] * args.requests

        def prompts() -> list[list[int]]:
            return [[rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)]

        decode_step_s(llm, prompts(), mixed_loras, 3)  # warm: allocator, adapters into their slots
        runs = {"base": [], "mixed": []}
        ratios = []
        for pair in range(args.pairs):
            for side in ("base", "mixed") if pair % 2 == 0 else ("mixed", "base"):
                loras_of_side = mixed_loras if side == "mixed" else base_loras
                step = decode_step_s(llm, prompts(), loras_of_side, args.steps)
                runs[side].append(step)
                print(f"pair {pair} {side}: {step * 1e3:.2f} ms/step", flush=True)
            ratios.append(runs["mixed"][-1] / runs["base"][-1])
        info = llm.engine.core.info
        llm.shutdown()
    median = statistics.median(ratios)
    verdict = "meets" if median <= TARGET_RATIO else "misses"
    print(f"mixed ({args.adapters} adapters + base) / base-only decode step at {args.requests} "
          f"requests: {median:.3f}x (pairs {min(ratios):.3f}-{max(ratios):.3f}); {verdict} the "
          f"<= {TARGET_RATIO}x target")
    figures = {"step_s": runs, "mixed_over_base_per_pair": ratios,
               "mixed_over_base_median": median, "target_ratio": TARGET_RATIO,
               "meets_target": median <= TARGET_RATIO}
    model_name = "tests' tiny random Llama" if args.tiny_llama else str(model_dir)
    config = {"model": model_name, "requests": args.requests, "adapters": args.adapters,
              "rank": args.rank, "targets": TARGETS, "prompt_len": args.prompt_len, "steps": args.steps,
              "pairs": args.pairs,
              "dtype": info.dtype, "device": info.device, "threads": torch.get_num_threads(),
              "forward": "python (KVDECK_CPU_NATIVE=0), torch LoRA path (rows grouped by adapter)",
              "load_average_before_after": [load_before, os.getloadavg()]}
    if args.out:
        write_json_atomic(Path(args.out), build_result("lora_mix", config, figures))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
