"""Write the demo model's MODEL_CARD.md: what it is, its data and licence, measured figures,
and sample completions and chat answers generated with transformers (greedy and sampled)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

COMPLETION_PROMPTS = (
    "Return a list of",
    'The "for" statement',
    "Function json.dumps",
)
CHAT_QUESTIONS = (
    "What does json.dumps do?",
    "How do I use str.split?",
    "What is the os.path module?",
    'Explain the "with" statement.',
    "What does collections.namedtuple do?",  # collections is held out: shows the limits
)
MAX_NEW_TOKENS = 96
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.9}


@dataclass(slots=True)
class CardFacts:
    settings: dict[str, object]
    n_params: int
    vocab_size: int
    train_tokens: int
    heldout_tokens: int
    steps_run: int
    train_minutes: float
    final_loss: float
    heldout_ppl: float
    sample_ppl: float
    modules: int
    heldout_modules: list[str]
    versions: dict[str, str]
    command: str
    runs: list[dict[str, object]]


@torch.no_grad()
def generate(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, ids: list[int],
             sampled: bool, keep_prompt: bool = False) -> str:
    torch.manual_seed(0)
    x = torch.tensor([ids])
    kwargs = SAMPLING if sampled else {"do_sample": False}
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW_TOKENS,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         **kwargs)
    # Decoding prompt and continuation together keeps the space between them.
    start = 0 if keep_prompt else len(ids)
    return tokenizer.decode(out[0, start:], skip_special_tokens=True).strip()


def chat_ids(tokenizer: PreTrainedTokenizerFast, question: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             tokenize=False, add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in text.splitlines()) or "> (empty)"


def samples_markdown(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> str:
    model.eval()
    parts = ["## Sample chat answers\n",
             f"Generated with transformers `generate`, at most {MAX_NEW_TOKENS} new tokens; "
             f"sampled = temperature {SAMPLING['temperature']}, top-p {SAMPLING['top_p']}, "
             "`torch.manual_seed(0)`.\n"]
    for question in CHAT_QUESTIONS:
        ids = chat_ids(tokenizer, question)
        parts.append(f"### User: {question}\n")
        parts.append(f"Greedy:\n\n{_quote(generate(model, tokenizer, ids, False))}\n")
        parts.append(f"Sampled:\n\n{_quote(generate(model, tokenizer, ids, True))}\n")
    parts.append("## Sample completions (plain prompt, bos added)\n")
    for prompt in COMPLETION_PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        parts.append(f"### Prompt: `{prompt}`\n")
        parts.append(f"Greedy:\n\n{_quote(generate(model, tokenizer, ids, False, True))}\n")
        parts.append(f"Sampled:\n\n{_quote(generate(model, tokenizer, ids, True, True))}\n")
    return "\n".join(parts)


def runs_markdown(runs: list[dict[str, object]]) -> str:
    """One line per training run; a run with --init-from continues the one before it."""
    lines = ["- Runs, in order (each deterministic for its seed; reproduce by running them in turn):"]
    for i, run in enumerate(runs, 1):
        lines.append(f"  {i}. `{run['command']}`: {run['steps']} steps, "
                     f"{int(run['tokens_seen']) / 1e6:.2f}M tokens, peak LR {run['peak_lr']}, "
                     f"{run['train_minutes']} min, final train loss {run['final_train_loss']}")
    return "\n".join(lines)


def card_markdown(facts: CardFacts, samples: str) -> str:
    s = facts.settings
    held = ", ".join(facts.heldout_modules)
    v = facts.versions
    return f"""# kvdeck demo model

A {facts.n_params / 1e6:.2f}M-parameter Llama-architecture language model trained from
scratch by kvdeck's own script (`scripts/train_demo_model.py`) on the documentation that ships
inside Python {v['python']}. It exists so that `kvdeck` runs offline out of the box and so that
tests have a model with real (not random) weights. It answers questions about Python's
standard library in the style of a docstring; it is a toy, not an assistant: it invents
details, repeats itself, and knows nothing beyond those docstrings.

## Format
- `LlamaForCausalLM`, {s['num_layers']} layers, hidden {s['hidden_size']}, intermediate
  {s['intermediate_size']}, {s['num_heads']} query heads and {s['num_kv_heads']} KV heads (GQA),
  head_dim 64, RoPE theta 10000, tied input/output embeddings, context
  {s['seq_len']} tokens; weights in float16 safetensors.
- Tokenizer: byte-level BPE ({facts.vocab_size} tokens) trained with `tokenizers` on the
  training split; special tokens `<s>` (bos), `</s>` (eos, also ends every chat turn),
  `<pad>`, `<|system|>`, `<|user|>`, `<|assistant|>`. A plain prompt gets `<s>` prepended.
- Chat template (in `tokenizer_config.json`):
  `<s><|system|>\\n...</s><|user|>\\n...</s><|assistant|>\\n...</s>`; with
  `add_generation_prompt=True` it ends in `<|assistant|>\\n`.

## Training data and licence
- Source: the docstrings of the Python standard library modules importable on the training
  machine (read with `inspect`: modules, public classes, functions and methods; doctest lines
  removed) and the language-reference pages behind `help()` (`pydoc_data.topics`). Each object
  is used twice: as plain text (`Function json.dumps(obj, ...)` + docstring) and as a chat turn
  ("What does json.dumps do?" -> signature and the first paragraphs of the docstring).
- Licence of the text: Python Software Foundation License Version 2 (the documentation and
  docstrings are part of CPython, © Python Software Foundation). Nothing was downloaded.
- {facts.modules} modules. Held out by a stable hash of the top-level module name (never seen
  in training, not even by the tokenizer): {held}; plus a share of the reference pages.

## Training
{runs_markdown(facts.runs)}
- {facts.train_tokens / 1e6:.2f}M training tokens packed into {s['seq_len']}-token windows,
  batches of {s['batch_size']} windows; last run: AdamW (betas 0.9/0.95, weight decay
  {s['weight_decay']}), peak LR {s['lr']}, {s['warmup_steps']} warmup steps, cosine decay to
  a tenth; gradient clip 1.0; float32.
- {s['threads']} CPU threads (`nice -n 5` on a 2-core machine shared with other jobs, so the
  wall times above are longer than the same run takes on two idle cores).
- Versions: torch {v['torch']}, transformers {v['transformers']},
  tokenizers {v['tokenizers']}.

## Results
| measure | value |
| --- | --- |
| final training loss (mean of the last 50 steps) | {facts.final_loss:.3f} |
| held-out perplexity ({facts.heldout_tokens} tokens of held-out modules, text + chats) \
| {facts.heldout_ppl:.2f} |
| perplexity on `heldout.txt` (what `tests/test_demo_model.py` recomputes) \
| {facts.sample_ppl:.2f} |
| uniform over the vocabulary (for scale) | {facts.vocab_size} |

Perplexities are computed from the float16 checkpoint in float32 with transformers.

## Limits
- Knows only the docstrings of one Python version; answers about held-out or non-stdlib
  names are plausible-looking inventions.
- {s['seq_len']}-token context; beyond that RoPE positions were never trained.
- Greedy decoding tends to loop; sampling (temperature 0.7, top-p 0.9) reads better.

{samples}"""


def write_model_card(folder: Path, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast,
                     facts: CardFacts) -> None:
    text = card_markdown(facts, samples_markdown(model, tokenizer))
    tmp = folder / "MODEL_CARD.md.tmp"
    tmp.write_text(text)
    os.replace(tmp, folder / "MODEL_CARD.md")
