"""Train kvdeck's bundled demo model: a small Llama on Python's own documentation.

Builds the corpus (scripts/demo_corpus.py), trains a byte-level BPE tokenizer, trains a
LlamaForCausalLM with AdamW and a cosine schedule on CPU, measures held-out perplexity,
generates sample answers with transformers and writes everything, with a model card, to
assets/demo_model/ (written to a temporary folder, then swapped in).

    nohup nice -n 5 python scripts/train_demo_model.py > /tmp/demo_train.log 2>&1 &

Deterministic for a seed, a thread count and a Python version (the corpus is the running
interpreter's docstrings).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_corpus  # noqa: E402 - sibling module, importable when run as a script
from demo_model_card import CardFacts, write_model_card  # noqa: E402

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Every turn ends with eos, so generation stops at the end of the assistant's answer.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + (message['content'] | trim) + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
HELDOUT_SAMPLE_CHARS = 6000
RUNS_FILE = "training_runs.json"  # every training run that led to these weights, in order


@dataclass(slots=True)
class TrainSettings:
    out_dir: Path
    seed: int
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    warmup_steps: int
    weight_decay: float
    max_minutes: float
    threads: int
    eval_windows: int
    init_from: Path | None
    copy_fraction: float
    copy_random_share: float


def parse_args(argv: list[str] | None = None) -> TrainSettings:
    assets = Path(__file__).resolve().parents[1] / "assets"
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=assets / "demo_model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--num-layers", type=int, default=6)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=25)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-minutes", type=float, default=90.0,
                   help="stop training early (and still save) after this much wall time")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-windows", type=int, default=64,
                   help="held-out windows of seq-len tokens used for the perplexity figure")
    p.add_argument("--init-from", type=Path, default=None,
                   help="continue training this demo model (its tokenizer and weights) instead "
                        "of starting from scratch; its training_runs.json is carried over")
    p.add_argument("--copy-fraction", type=float, default=0.0,
                   help="share of the training tokens in copy documents (a passage, then the same "
                        "passage again), to teach the model to continue text in its context")
    p.add_argument("--copy-random-share", type=float, default=0.5,
                   help="share of the copy documents whose passage is random token ids")
    s = TrainSettings(**vars(p.parse_args(argv)))
    for name in ("hidden_size", "intermediate_size"):
        if getattr(s, name) % 128:  # AWQ packs in-features in groups of 128
            raise ValueError(f"{name} must be divisible by 128, got {getattr(s, name)}")
    if s.hidden_size != 64 * s.num_heads:
        raise ValueError(f"hidden_size must be 64 * num_heads (head_dim 64), got {s.hidden_size}")
    if s.num_heads % s.num_kv_heads or s.num_kv_heads >= s.num_heads:
        raise ValueError("num_kv_heads must divide num_heads and be smaller (GQA)")
    if not 0.0 <= s.copy_fraction < 1.0 or not 0.0 <= s.copy_random_share <= 1.0:
        raise ValueError(f"copy_fraction must be in [0, 1) and copy_random_share in [0, 1], got "
                         f"{s.copy_fraction} and {s.copy_random_share}")
    if s.steps < 1 or s.warmup_steps >= s.steps:
        raise ValueError(f"steps ({s.steps}) must exceed warmup_steps ({s.warmup_steps})")
    return s


def train_tokenizer(corpus: demo_corpus.Corpus, vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the training split only, wrapped for AutoTokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    chat_text = (m["content"] for chat in corpus.train_chats for m in chat)
    tok.train_from_iterator(iter([*corpus.train_texts, *chat_text]), trainer=trainer)
    # A plain prompt gets bos like Llama's tokenizers; chat templates add it themselves.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS), chat_template=CHAT_TEMPLATE,
        model_max_length=512, padding_side="left", clean_up_tokenization_spaces=False)


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: list[str],
                     chats: list[list[dict[str, str]]]) -> list[list[int]]:
    """Each document as token ids: bos text eos, or the chat rendered by the template."""
    rendered = [f"{BOS}{t}{EOS}" for t in texts]
    rendered += [tokenizer.apply_chat_template(c, tokenize=False) for c in chats]
    encoded = tokenizer.backend_tokenizer.encode_batch(rendered, add_special_tokens=False)
    return [e.ids for e in encoded]


def copy_documents(tokenizer: PreTrainedTokenizerFast, docs: list[list[int]], num_tokens: int,
                   seed: int, random_share: float) -> list[list[int]]:
    """About num_tokens of documents that repeat a passage.

    A passage is a random span of 16-200 tokens of a document of `docs` (without its bos/eos)
    or, for `random_share` of them, as many random token ids. It is followed by a blank line
    and the passage again, or sent in a user turn that the assistant answers with it. Only
    copying (induction heads) continues a random passage; repeated corpus text alone teaches
    recall of the corpus. The shipped model never learned to copy: runs of up to 26 minutes
    with this option did not change that (README, "Speculative decoding").
    """
    rng = random.Random(seed)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    blank = tokenizer.encode("\n\n", add_special_tokens=False)
    user, assistant = (tokenizer.encode(f"{role}\n", add_special_tokens=False)
                       for role in ("<|user|>", "<|assistant|>"))
    ask = tokenizer.encode("\n\nRepeat the text above.", add_special_tokens=False)
    bodies = [d[1:-1] for d in docs if len(d) >= 18]
    first_plain = len(tokenizer.all_special_ids)  # the special tokens take the first ids
    out: list[list[int]] = []
    total = 0
    while total < num_tokens:
        if rng.random() < random_share:
            passage = [rng.randrange(first_plain, len(tokenizer)) for _ in range(rng.randint(16, 200))]
        else:
            body = rng.choice(bodies)
            length = rng.randint(16, min(200, len(body)))
            start = rng.randrange(len(body) - length + 1)
            passage = body[start: start + length]
        if rng.random() < 0.7:
            doc = [bos, *passage, *blank, *passage, eos]
        else:
            doc = [bos, *user, *passage, *ask, eos, *assistant, *passage, eos]
        out.append(doc)
        total += len(doc)
    return out


def pack(docs: list[list[int]], seq_len: int, seed: int) -> torch.Tensor:
    """Shuffle documents, concatenate, cut into [n, seq_len] windows (tail dropped)."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    stream = [t for i in order for t in docs[i]]
    n = len(stream) // seq_len
    if n == 0:
        raise ValueError(f"corpus has {len(stream)} tokens, fewer than seq_len {seq_len}")
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def build_model(s: TrainSettings, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size, num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads, head_dim=64,
        max_position_embeddings=s.seq_len, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup then cosine decay to a tenth of the peak."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def perplexity(model: LlamaForCausalLM, windows: torch.Tensor, batch: int = 8) -> float:
    """exp of the mean next-token loss over all predicted positions of the windows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        x = windows[i: i + batch]
        loss = model(input_ids=x, labels=x).loss
        n = x.numel() - x.shape[0]
        total += loss.item() * n
        count += n
    model.train()
    return math.exp(total / count)


def train(model: LlamaForCausalLM, data: torch.Tensor, s: TrainSettings) -> tuple[float, int]:
    """AdamW with cosine LR; returns the mean loss of the last 50 steps and steps run."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(s.seed)
    order = torch.randperm(len(data), generator=gen)
    cursor, recent = 0, []
    start = time.monotonic()
    model.train()
    step = 0
    for step in range(s.steps):
        if cursor + s.batch_size > len(order):  # next epoch, new window order
            order, cursor = torch.randperm(len(data), generator=gen), 0
        x = data[order[cursor: cursor + s.batch_size]]
        cursor += s.batch_size
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent = [*recent[-49:], loss.item()]
        elapsed = time.monotonic() - start
        if step % 25 == 0 or step == s.steps - 1:
            rate = (step + 1) * x.numel() / elapsed
            eta = elapsed / (step + 1) * (s.steps - step - 1)
            print(f"step {step:5d}  loss {loss.item():.3f}  lr {lr_at(step, s):.2e}  "
                  f"{rate:.0f} tok/s  elapsed {elapsed / 60:.1f} min  eta {eta / 60:.1f} min",
                  flush=True)
        if elapsed > s.max_minutes * 60:
            print(f"time budget of {s.max_minutes} min reached at step {step}", flush=True)
            break
    return sum(recent) / len(recent), step + 1


def heldout_sample(texts: list[str]) -> str:
    """A few whole held-out documents, spread over the split, for the fast test."""
    picked: list[str] = []
    size = 0
    for text in texts[:: max(1, len(texts) // 40)]:
        if size + len(text) > HELDOUT_SAMPLE_CHARS:
            continue
        picked.append(text)
        size += len(text) + 2
    return "\n\n".join(picked) + "\n"


def text_perplexity(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast,
                    text: str, seq_len: int) -> float:
    """The figure tests/test_demo_model.py recomputes: bos + text, cut into seq_len windows."""
    ids = tokenizer(text)["input_ids"]
    n = len(ids) // seq_len * seq_len
    return perplexity(model, torch.tensor(ids[:n]).view(-1, seq_len))


def add_legacy_keys(folder: Path) -> None:
    """Keys that transformers 4.x and other Llama loaders read, beside transformers 5's names."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    config["torch_dtype"] = config["dtype"]
    _write_json(config_path, config)
    tok_path = folder / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    tok["tokenizer_class"] = "PreTrainedTokenizerFast"
    for loader_state in ("is_local", "local_files_only"):  # left by from_pretrained (--init-from)
        tok.pop(loader_state, None)
    tok["additional_special_tokens"] = tok.pop("extra_special_tokens", list(ROLE_TOKENS))
    _write_json(tok_path, tok)


def _write_json(path: Path, data: dict[str, object] | list[dict[str, object]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def write_atomically(out_dir: Path, write) -> None:
    """Write into a temp folder beside out_dir, then swap it in, so a crash leaves the old one."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        write(tmp)
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        if out_dir.exists():
            os.replace(out_dir, old)
        for path in [tmp, *tmp.iterdir()]:  # mkdtemp and safetensors create private files
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> None:
    s = parse_args(argv)
    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    random.seed(s.seed)
    t0 = time.monotonic()
    corpus = demo_corpus.build_corpus(seed=s.seed)
    if s.init_from is None:
        tokenizer = train_tokenizer(corpus, s.vocab_size)
        earlier_runs: list[dict[str, object]] = []
    else:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(s.init_from)
        earlier_runs = json.loads((s.init_from / RUNS_FILE).read_text())
    train_docs = encode_documents(tokenizer, corpus.train_texts, corpus.train_chats)
    heldout_docs = encode_documents(tokenizer, corpus.heldout_texts, corpus.heldout_chats)
    if s.copy_fraction:
        stream = sum(map(len, train_docs))
        num_copy_tokens = int(stream * s.copy_fraction / (1 - s.copy_fraction))
        train_docs += copy_documents(tokenizer, train_docs, num_copy_tokens, s.seed, s.copy_random_share)
    data = pack(train_docs, s.seq_len, s.seed)
    heldout = pack(heldout_docs, s.seq_len, s.seed)[: s.eval_windows]
    print(f"corpus: {len(corpus.modules)} modules, {data.numel()} train tokens, "
          f"{heldout.numel()} held-out tokens, vocab {len(tokenizer)}, "
          f"prep {time.monotonic() - t0:.0f}s", flush=True)

    if s.init_from is None:
        model = build_model(s, tokenizer)
    else:
        model = LlamaForCausalLM.from_pretrained(s.init_from, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)
    t_train = time.monotonic()
    final_loss, steps_run = train(model, data, s)
    train_minutes = (time.monotonic() - t_train) / 60

    # Measure the checkpoint as shipped: fp16 weights, computed in fp32.
    model = model.half().float()
    heldout_ppl = perplexity(model, heldout)
    sample_text = heldout_sample(corpus.heldout_texts)
    sample_ppl = text_perplexity(model, tokenizer, sample_text, s.seq_len)
    print(f"final train loss {final_loss:.3f}  held-out ppl {heldout_ppl:.2f}  "
          f"heldout.txt ppl {sample_ppl:.2f}", flush=True)

    command = "python scripts/train_demo_model.py " + " ".join(argv or sys.argv[1:])
    runs = [*earlier_runs, {"command": command, "seed": s.seed, "steps": steps_run,
                            "tokens_seen": steps_run * s.batch_size * s.seq_len,
                            "train_minutes": round(train_minutes, 1), "peak_lr": s.lr,
                            "final_train_loss": round(final_loss, 3),
                            **({"copy_fraction": s.copy_fraction, "copy_random_share": s.copy_random_share}
                               if s.copy_fraction else {})}]

    def write(folder: Path) -> None:
        model.half()
        model.config.dtype = torch.float16
        model.save_pretrained(folder, safe_serialization=True)
        model.float()
        GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
        tokenizer.save_pretrained(folder, save_jinja_files=False)
        (folder / "special_tokens_map.json").write_text(json.dumps(
            {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
             "additional_special_tokens": list(ROLE_TOKENS)}, indent=2) + "\n")
        (folder / "heldout.txt").write_text(sample_text)
        _write_json(folder / RUNS_FILE, runs)
        add_legacy_keys(folder)
        facts = CardFacts(
            settings=vars_of(s), n_params=n_params, vocab_size=len(tokenizer),
            train_tokens=data.numel(), heldout_tokens=heldout.numel(), steps_run=steps_run,
            train_minutes=train_minutes, final_loss=final_loss, heldout_ppl=heldout_ppl,
            sample_ppl=sample_ppl, modules=len(corpus.modules),
            heldout_modules=corpus.heldout_modules,
            versions={"python": platform.python_version(), "torch": torch.__version__,
                      "transformers": transformers.__version__,
                      "tokenizers": tokenizers.__version__},
            command=command, runs=runs)
        write_model_card(folder, model, tokenizer, facts)

    write_atomically(s.out_dir, write)
    size = sum(f.stat().st_size for f in s.out_dir.iterdir())
    print(f"wrote {s.out_dir} ({size / 1e6:.1f} MB) in {(time.monotonic() - t0) / 60:.1f} min",
          flush=True)


def vars_of(s: TrainSettings) -> dict[str, object]:
    return {name: str(v) if isinstance(v := getattr(s, name), Path) else v
            for name in TrainSettings.__slots__}


if __name__ == "__main__":
    main()
