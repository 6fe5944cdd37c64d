"""End-to-end decode of the W4A16 stage (bench_w4a16.py --e2e): a Llama-3.2-1B-shaped model
with dummy weights in bf16, then as AWQ INT4 on the repacked `marlin` kernel (on request, `awq`:
on the AWQ-layout kernel, which `auto` no longer serves); batch 1 (the target: AWQ >= 2x its
bf16 self) and 16; and the first two again with programmatic dependent launch (`_pdl`:
KVDECK_PDL=1, off by default until measured; w4a16_tune.pdl_effect compares each with its
twin, greedy tokens included, which must agree); last the AWQ engine with the MLP's activation
as a launch of its own (`_unfused`: KVDECK_FUSED_ACTIVATION=0, against the default's epilogue).
Each engine runs in a process of its own
(`run_variant`), so one's GPU memory is gone before the next.
After the timed runs, `PROFILED_STEPS` batch-1 decode steps run under torch.profiler
(step_kernels.py): the batch-1 row's `kernels` says where a step's time went (device time by kind:
w4a16, gemm (cuBLAS: the bf16 projections, the tied lm_head), attention, ...; the device's
idle time), which bounds what faster W4A16 kernels can buy end to end.

    python benchmarks/w4a16_e2e.py VARIANT [--smoke] [--tuned-entry JSON]

--tuned-entry: a TUNED-style entry (benchmarks/w4a16_tune.py) the marlin kernel serves this
GPU's architecture with, in that process: the bench's own sweep's pick, before it is committed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvdeck.quant.checkpoint import AWQ_QUANTIZATION_CONFIG

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_kernels import decoding, profile_steps_or_error  # noqa: E402

LLAMA_32_1B = json.loads((Path(__file__).resolve().parent / "configs" / "llama-3.2-1b" / "config.json")
                         .read_text())
TINY_LLAMA = {**LLAMA_32_1B, "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
# The target's pair first (a w4a16 stage cut at its cap keeps them), then the same pair with
# programmatic dependent launch (KVDECK_PDL=1, kernels/triton/pdl.py): what bench_w4a16.py
# --e2e runs, and last the AWQ engine with the MLP's activation as its own launch
# (`_unfused`: KVDECK_FUSED_ACTIVATION=0; w4a16_tune.fused_activation_verdict). `awq` (the
# AWQ-layout kernel, which `auto` no longer serves) runs on request.
VARIANTS = ("bf16", "awq_marlin", "awq_marlin_pdl", "bf16_pdl", "awq_marlin_unfused")
ALL_VARIANTS = (*VARIANTS, "awq")
RESULT_PREFIX = "E2E_RESULT "
PROFILED_STEPS = 32  # batch-1 decode steps under the profiler (about 1 ms each on an H200)


def run_variant(variant: str, smoke: bool, tuned_entry: dict | None = None) -> dict:
    """One engine's figures, from a process of its own; RuntimeError with its stderr if it fails."""
    command = [sys.executable, __file__, variant, *(["--smoke"] if smoke else [])]
    if tuned_entry is not None and variant.startswith("awq_marlin"):
        command += ["--tuned-entry", json.dumps(tuned_entry)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"e2e {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def decode(variant: str, smoke: bool, tuned_entry: dict | None) -> dict:
    """Decode throughput of one engine, in this process."""
    from kvdeck import LLM, SamplingParams

    pdl = variant.endswith("_pdl")
    if pdl:  # read at the first launch, so before the engine starts
        os.environ["KVDECK_PDL"] = "1"
    if variant.endswith("_unfused"):  # read as the weights are repacked at load
        os.environ["KVDECK_FUSED_ACTIVATION"] = "0"
    variant, name = variant.removesuffix("_pdl").removesuffix("_unfused"), variant
    config = dict(TINY_LLAMA if smoke else LLAMA_32_1B)
    if variant == "awq_marlin":  # the repack happens at load, as the engine reads it there
        os.environ["KVDECK_W4A16_KERNEL"] = "marlin"
        # On the CPU only the triton backend repacks (the kernel interpreted).
        config["quantization_config"] = ({**AWQ_QUANTIZATION_CONFIG, "w4a16_backend": "triton"} if smoke
                                         else AWQ_QUANTIZATION_CONFIG)
    elif variant == "awq":
        os.environ["KVDECK_W4A16_KERNEL"] = "awq"
        config["quantization_config"] = AWQ_QUANTIZATION_CONFIG
    tuning_source = None
    if variant == "awq_marlin":
        from kvdeck.kernels.triton import w4a16_marlin_plan as plan

        arch = _arch()
        if tuned_entry is not None:
            plan.use_tuning(arch, tuned_entry)
        tuning_source = plan.tuning(arch).source
    dtype = "float16" if variant.startswith("awq") else "bfloat16"
    rows = []
    with tempfile.TemporaryDirectory() as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(config))
        kwargs = {"device": "cpu", "dtype": "float32"} if smoke else {"dtype": dtype}
        # Batches of 1 and 16, contexts under 512: no more decode graphs captured than they use.
        llm = LLM(model=model_dir, load_format="dummy", max_model_len=512, max_num_seqs=16, **kwargs)
        # What serves the logits: an INT4 model's head is int8 (quant/int8_head.py) unless
        # KVDECK_INT8_HEAD=0, the bf16 model's its dense tied embedding.
        output_head = type(llm.engine.core.runner.model.lm_head).__name__
        # Whether the MLPs' activation runs in the gate | up GEMM's epilogue (the AWQ engine's default).
        fused_activation = all(layer.mlp.gate_up_proj.fuses_activation()
                               for layer in llm.engine.core.runner.model.model.layers)
        # The smoke run interprets the kernels: short prompts and few tokens keep it seconds.
        prompt_len, new_tokens = (16, 2) if smoke else (128, 256)
        for batch in (1, 2) if smoke else (1, 16):
            params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
            prompts = [[(7 * i + j) % 900 + 10 for j in range(prompt_len)] for i in range(batch)]
            warm_up = SamplingParams(max_tokens=2 if smoke else 4, ignore_eos=True)
            llm.generate(prompts[:1], warm_up)
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            wall = time.perf_counter() - start
            per_token = [(o.metrics.last_token_time - o.metrics.first_token_time)
                         / max(1, len(o.outputs[0].token_ids) - 1) for o in outputs]
            rows.append({
                "batch": batch, "prompt_tokens": prompt_len, "new_tokens": new_tokens,
                "wall_s": wall, "output_tokens_per_s": batch * new_tokens / wall,
                "mean_inter_token_latency_ms": 1e3 * sum(per_token) / len(per_token),
                # The first request's greedy tokens: a `_pdl` engine's must equal its twin's.
                "tokens": list(outputs[0].outputs[0].token_ids),
            })
        # After every timed run (the profiler's hooks never touch a figure): batch 1's steps.
        steps = 2 if smoke else PROFILED_STEPS
        with decoding(llm, prompts[:1], max_tokens=steps + 8):
            rows[0]["kernels"] = profile_steps_or_error(llm.engine.step, steps)
    return {"variant": name, "dtype": kwargs.get("dtype"), "pdl": pdl, "fused_activation": fused_activation,
            "marlin_tuning": tuning_source,
            "output_head": output_head, "runs": rows}


def _arch() -> int | None:
    import torch

    from kvdeck.kernels.triton.launch import device_arch

    return device_arch(torch.device("cuda")) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=ALL_VARIANTS)
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--tuned-entry", type=json.loads, default=None,
                        help="a TUNED-style entry (JSON) for this GPU's architecture")
    args = parser.parse_args(argv)
    print(RESULT_PREFIX + json.dumps(decode(args.variant, args.smoke, args.tuned_entry)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
