"""Does a model copy from its context? What bounds prompt lookup (n-gram speculation).

Each row is bos, a passage, a blank line, then the passage again; the figure is the share
of the repeat's tokens (after its first `--given`) that the model's top-1 prediction gets
right, teacher-forced, in one forward. Three kinds of passage: held-out modules of the demo
corpus (text the model never saw), training modules (text it may partly recall), and random
token ids (only copying predicts those: a model with induction heads scores near 100%,
one without scores 0%).

    python benchmarks/quality_copy.py --out benchmarks/results/quality_copy_demo.json
"""

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ASSETS = Path(__file__).resolve().parents[1] / "assets"
sys.path.insert(0, str(ASSETS.parent / "scripts"))
import demo_corpus  # noqa: E402 - the demo's corpus and trainer, in scripts/
from train_demo_model import encode_documents  # noqa: E402


def copy_accuracy(model, tokenizer, passages: list[list[int]], given: int) -> float:
    """Top-1 accuracy on each passage's repeat after its first `given` tokens."""
    blank = tokenizer.encode("\n\n", add_special_tokens=False)
    rows = torch.tensor([[tokenizer.bos_token_id, *p, *blank, *p] for p in passages])
    with torch.no_grad():
        predicted = model(input_ids=rows).logits.argmax(-1)
    first = 1 + len(passages[0]) + len(blank) + given  # the first scored token of the repeat
    return (predicted[:, first - 1: -1] == rows[:, first:]).float().mean().item()


def spans(docs: list[list[int]], num: int, length: int, rng: random.Random) -> list[list[int]]:
    bodies = [d[1:-1] for d in docs if len(d) >= length + 2]  # without bos / eos
    out = []
    for body in rng.sample(bodies, min(num, len(bodies))):
        start = rng.randrange(len(body) - length + 1)
        out.append(body[start: start + length])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ASSETS / "demo_model"))
    parser.add_argument("--num", type=int, default=32, help="passages of each kind")
    parser.add_argument("--length", type=int, default=96, help="tokens a passage")
    parser.add_argument("--given", type=int, default=24, help="tokens of the repeat given before scoring")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    corpus = demo_corpus.build_corpus(seed=0)
    rng = random.Random(0)
    first_plain = len(tokenizer.all_special_ids)
    kinds = {
        "heldout_text": spans(encode_documents(tokenizer, corpus.heldout_texts, corpus.heldout_chats),
                              args.num, args.length, rng),
        "training_text": spans(encode_documents(tokenizer, corpus.train_texts, corpus.train_chats),
                               args.num, args.length, rng),
        "random_ids": [[rng.randrange(first_plain, len(tokenizer)) for _ in range(args.length)]
                       for _ in range(args.num)],
    }
    figures = {kind: copy_accuracy(model, tokenizer, passages, args.given)
               for kind, passages in kinds.items()}
    for kind, value in figures.items():
        print(f"{kind:14s} {value:.1%} of the repeat's tokens predicted (top-1)")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "benchmark": "quality_copy", "command": "python " + " ".join(sys.argv), "model": args.model,
            "passages": args.num, "length": args.length, "given": args.given,
            "top1_accuracy_on_repeat": figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
