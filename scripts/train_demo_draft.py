"""Train the bundled draft model for speculative decoding: a one-layer Llama distilled from
the demo model (assets/demo_model), with the demo's tokenizer.

The draft starts from the demo model's embeddings (tied with its output head), its first
decoder layer and its final norm, then learns to match the demo model's next-token
distribution (KL divergence to the teacher's soft labels, the teacher run alongside in
float32) on three kinds of text: the demo's own training windows, and the demo model's
greedy and sampled continuations of training snippets (generated with kvdeck, so the draft
also sees the loops and phrasing the demo produces when it decodes). Writes
assets/demo_draft/ (a temporary folder swapped in), with a short model card. It lives in
scripts/, not beside the demo's trainer in assets/, because it runs kvdeck itself (the
package's assets may import nothing of kvdeck).

    nohup nice -n 5 python scripts/train_demo_draft.py > /tmp/draft_train.log 2>&1 &

Deterministic for a seed, a thread count, a Python version (the corpus is the running
interpreter's docstrings) and a step count: the budget is wall-clock (`--max-minutes`), so
on a busy machine fewer steps run; `--max-steps` with a large budget pins it. The bundled
draft ran 63 steps in 8 minutes on a shared, loaded 2-core machine (its training.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parents[1] / "assets"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_corpus  # noqa: E402 - the demo's corpus and trainer, scripts beside this one
from train_demo_model import encode_documents, pack, write_atomically  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(slots=True)
class DraftSettings:
    teacher: Path
    out_dir: Path
    seed: int
    num_layers: int
    intermediate_size: int
    seq_len: int
    batch_size: int
    lr: float
    warmup_steps: int
    max_minutes: float
    max_steps: int
    gen_prompts: int
    gen_tokens: int
    eval_windows: int
    threads: int


def parse_args(argv: list[str] | None = None) -> DraftSettings:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", type=Path, default=HERE / "demo_model")
    p.add_argument("--out-dir", type=Path, default=HERE / "demo_draft")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--max-minutes", type=float, default=12.0,
                   help="training time budget (the cosine schedule is laid over it)")
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--gen-prompts", type=int, default=192,
                   help="training snippets the teacher continues (half greedy, half sampled)")
    p.add_argument("--gen-tokens", type=int, default=224)
    p.add_argument("--eval-windows", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    s = DraftSettings(**vars(p.parse_args(argv)))
    if s.num_layers < 1 or s.max_minutes <= 0:
        raise ValueError("--num-layers must be >= 1 and --max-minutes > 0")
    return s


def teacher_generations(teacher_dir: Path, docs: list[list[int]], s: DraftSettings) -> list[list[int]]:
    """The teacher's continuations of training snippets, decoded by kvdeck: half greedy (the
    loops a greedy decode falls into), half sampled at temperature 0.8."""
    from kvdeck import LLM, SamplingParams

    rng = random.Random(s.seed)
    prompts = [doc[: rng.randint(8, 48)] for doc in rng.sample(docs, s.gen_prompts) if len(doc) > 8]
    half = len(prompts) // 2
    params = [SamplingParams(temperature=0.0, max_tokens=s.gen_tokens, ignore_eos=True, detokenize=False)
              ] * half + [SamplingParams(temperature=0.8, top_p=0.95, seed=s.seed + i,
                                         max_tokens=s.gen_tokens, ignore_eos=True, detokenize=False)
                          for i in range(len(prompts) - half)]
    with LLM(str(teacher_dir), max_model_len=512) as llm:
        outputs = llm.generate(prompts, params)
    return [p + o.outputs[0].token_ids for p, o in zip(prompts, outputs)]


def build_draft(teacher: LlamaForCausalLM, s: DraftSettings) -> LlamaForCausalLM:
    """A smaller Llama with the teacher's width and vocabulary, initialised from the teacher's
    embeddings, first layers and final norm (a far better start than random weights)."""
    t = teacher.config
    config = LlamaConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers, num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
        max_position_embeddings=t.max_position_embeddings, rope_theta=10000.0,
        rms_norm_eps=t.rms_norm_eps, tie_word_embeddings=True, bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id, attn_implementation="sdpa")
    draft = LlamaForCausalLM(config)
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(teacher.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(teacher.model.norm.weight)
        for mine, theirs in zip(draft.model.layers, teacher.model.layers):
            for name, param in mine.named_parameters():
                source = theirs.get_parameter(name)
                if source.shape == param.shape:
                    param.copy_(source)
                else:  # a narrower MLP: the teacher's first rows / columns
                    param.copy_(source[tuple(slice(0, n) for n in param.shape)])
    return draft


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per position, averaged over positions."""
    vocab = student_logits.shape[-1]
    return F.kl_div(F.log_softmax(student_logits.view(-1, vocab), -1),
                    F.log_softmax(teacher_logits.view(-1, vocab), -1),
                    log_target=True, reduction="batchmean")


def lr_at(elapsed_fraction: float, step: int, s: DraftSettings) -> float:
    """Linear warmup, then cosine decay to a tenth over the time budget."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed_fraction))))


def train(draft: LlamaForCausalLM, teacher: LlamaForCausalLM, data: torch.Tensor,
          s: DraftSettings) -> tuple[float, int, float]:
    """Returns the mean loss of the last 20 steps, the steps run and the minutes spent."""
    opt = torch.optim.AdamW(draft.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(s.seed)
    budget = s.max_minutes * 60
    started = time.monotonic()
    recent: list[float] = []
    step = 0
    draft.train()
    while step < s.max_steps and (elapsed := time.monotonic() - started) < budget:
        x = data[torch.randint(len(data), (s.batch_size,), generator=gen)]
        for group in opt.param_groups:
            group["lr"] = lr_at(elapsed / budget, step, s)
        with torch.no_grad():
            target = teacher(input_ids=x).logits
        loss = distill_loss(draft(input_ids=x).logits, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent = [*recent[-19:], loss.item()]
        if step % 20 == 0:
            print(f"step {step:5d}  kl {loss.item():.3f}  elapsed {elapsed / 60:.1f} min", flush=True)
        step += 1
    draft.eval()
    return sum(recent) / len(recent), step, (time.monotonic() - started) / 60


@torch.no_grad()
def agreement(draft: LlamaForCausalLM, teacher: LlamaForCausalLM, windows: torch.Tensor) -> float:
    """How often the draft's most likely next token is the teacher's (greedy acceptance)."""
    hits = total = 0
    for i in range(0, len(windows), 8):
        x = windows[i : i + 8]
        hits += (draft(input_ids=x).logits.argmax(-1) == teacher(input_ids=x).logits.argmax(-1)).sum().item()
        total += x.numel()
    return hits / total


def main(argv: list[str] | None = None) -> None:
    s = parse_args(argv)
    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    t0 = time.monotonic()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(s.teacher)
    teacher = LlamaForCausalLM.from_pretrained(s.teacher, dtype=torch.float32).eval()
    corpus = demo_corpus.build_corpus(seed=0)  # the teacher's own split
    train_docs = encode_documents(tokenizer, corpus.train_texts, corpus.train_chats)
    heldout_docs = encode_documents(tokenizer, corpus.heldout_texts, corpus.heldout_chats)
    generated = teacher_generations(s.teacher, train_docs, s)
    heldout_generated = teacher_generations(s.teacher, heldout_docs,
                                            dataclasses.replace(s, gen_prompts=16, seed=s.seed + 1))
    # Generations weigh as much as the corpus: they are what a decode loop feeds the draft.
    corpus_windows = pack(train_docs, s.seq_len, s.seed)
    gen_windows = pack(generated, s.seq_len, s.seed)
    repeats = max(1, len(corpus_windows) // max(1, len(gen_windows)))
    data = torch.cat([corpus_windows, gen_windows.repeat(repeats, 1)])
    eval_text = pack(heldout_docs, s.seq_len, s.seed)[: s.eval_windows]
    eval_gen = pack(heldout_generated, s.seq_len, s.seed)[: s.eval_windows]
    print(f"data: {corpus_windows.numel()} corpus tokens, {gen_windows.numel()} generated tokens "
          f"(x{repeats}), prep {(time.monotonic() - t0) / 60:.1f} min", flush=True)

    draft = build_draft(teacher, s)
    n_params = sum(p.numel() for p in draft.parameters())
    before = agreement(draft, teacher, eval_gen)
    final_kl, steps, minutes = train(draft, teacher, data, s)
    draft = draft.half().float()  # measured as shipped
    facts = {
        "parameters": n_params, "steps": steps, "train_minutes": round(minutes, 1),
        "tokens_seen": steps * s.batch_size * s.seq_len, "final_kl": round(final_kl, 4),
        "top1_agreement_heldout_text": round(agreement(draft, teacher, eval_text), 4),
        "top1_agreement_heldout_generations": round(agreement(draft, teacher, eval_gen), 4),
        "top1_agreement_heldout_generations_at_init": round(before, 4),
        "command": "python scripts/train_demo_draft.py " + " ".join(argv or sys.argv[1:]),
        "settings": vars_of(s),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }
    print(json.dumps(facts, indent=2), flush=True)

    def write(folder: Path) -> None:
        draft.half()
        draft.config.dtype = torch.float16
        draft.save_pretrained(folder, safe_serialization=True)
        GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
        for name in TOKENIZER_FILES:
            shutil.copy(s.teacher / name, folder / name)
        config = json.loads((folder / "config.json").read_text())
        config["torch_dtype"] = config["dtype"]
        config["rope_theta"] = 10000.0
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (folder / "training.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
        (folder / "MODEL_CARD.md").write_text(model_card(facts, draft.config))

    write_atomically(s.out_dir, write)
    size = sum(f.stat().st_size for f in s.out_dir.iterdir())
    print(f"wrote {s.out_dir} ({size / 1e6:.1f} MB) in {(time.monotonic() - t0) / 60:.1f} min", flush=True)


def model_card(facts: dict, config: LlamaConfig) -> str:
    return f"""# kvdeck demo draft model

The draft model kvdeck uses for speculative decoding of the bundled demo model
(`--speculative-config '{{"model": "demo-draft", "num_speculative_tokens": 3}}'`). It is not
meant to be used alone.

- `LlamaForCausalLM`, {config.num_hidden_layers} layer(s), hidden {config.hidden_size}, intermediate
  {config.intermediate_size}, {config.num_attention_heads} query heads and {config.num_key_value_heads} KV
  heads, tied embeddings, context {config.max_position_embeddings}; {facts['parameters'] / 1e6:.2f}M
  parameters in float16. The demo model's tokenizer (same files, same vocabulary).
- Trained by `scripts/train_demo_draft.py`: initialised from the demo model's embeddings, first
  layer and final norm, then distilled (KL divergence to the demo model's next-token
  distribution) on the demo model's training windows and on its own greedy and sampled
  continuations of training snippets. Same licence as the demo model's text (PSF).
- {facts['steps']} steps, {facts['tokens_seen']} tokens, {facts['train_minutes']} min on 2 CPU threads;
  final KL {facts['final_kl']}.
- Top-1 agreement with the demo model (the greedy acceptance rate of one draft token) on
  held-out modules: {facts['top1_agreement_heldout_text']:.1%} on their text,
  {facts['top1_agreement_heldout_generations']:.1%} on the demo model's continuations of their
  snippets ({facts['top1_agreement_heldout_generations_at_init']:.1%} before training).

Command: `{facts['command']}`
"""


def vars_of(s: DraftSettings) -> dict[str, object]:
    """The settings as JSON values; paths relative to the checkout where they lie in it."""
    root = HERE.parent
    return {name: (str(v.resolve().relative_to(root)) if v.resolve().is_relative_to(root) else str(v))
            if isinstance(v := getattr(s, name), Path) else v
            for name in DraftSettings.__slots__}


if __name__ == "__main__":
    main()
