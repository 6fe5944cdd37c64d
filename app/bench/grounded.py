"""An input-grounded workload: continue text that is in the prompt.

Each prompt is a passage of the bundled documentation text (Python docstrings, the AWQ
calibration text), then a blank line, then the passage's first quarter again: a model that
copies continues the passage, which is what prompt lookup (and a draft model) can predict.
Passages start at paragraph boundaries chosen by a seeded generator, so the workload is the
same on every run.
"""

import random

from kvdeck.assets import calibration_text


def grounded_prompts(tokenizer, num: int, input_len: int, seed: int) -> list[list[int]]:
    """`num` prompts of exactly `input_len` tokens (ValueError without a tokenizer)."""
    if tokenizer is None:
        raise ValueError("the grounded workload needs the model's tokenizer (not load_format dummy)")
    if input_len < 8:
        raise ValueError(f"the grounded workload needs --input-len >= 8, got {input_len}")
    text = calibration_text().read_text(encoding="utf-8")
    rng = random.Random(seed)
    separator = tokenizer.encode("\n\n", add_special_tokens=False)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    room = input_len - len(bos) - len(separator)
    head = room // 4
    passage_len = room - head
    prompts = []
    while len(prompts) < num:
        start = text.find("\n\n", rng.randrange(len(text))) + 2
        passage = tokenizer.encode(text[start : start + 8 * passage_len], add_special_tokens=False)
        if len(passage) < passage_len:
            continue  # too close to the end of the text
        passage = passage[:passage_len]
        prompts.append(bos + passage + separator + passage[:head])
    return prompts
