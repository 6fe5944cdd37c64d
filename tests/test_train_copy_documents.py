"""The demo trainer's copy documents (scripts/train_demo_model.py --copy-fraction): each
repeats its passage, plainly or as a chat turn answered with it."""

import sys
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from kvdeck.engine.types.model_path import demo_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from train_demo_model import copy_documents  # noqa: E402


def test_copy_documents_repeat_their_passage():
    tokenizer = PreTrainedTokenizerFast.from_pretrained(demo_model_dir())
    corpus = [[tokenizer.bos_token_id, *range(100, 140), tokenizer.eos_token_id]]
    docs = copy_documents(tokenizer, corpus, 5000, seed=0, random_share=0.5)
    assert sum(map(len, docs)) >= 5000
    blank = tokenizer.encode("\n\n", add_special_tokens=False)
    user = tokenizer.encode("<|user|>\n", add_special_tokens=False)
    assistant = tokenizer.encode("<|assistant|>\n", add_special_tokens=False)
    plain = random = 0
    for doc in docs:
        assert doc[0] == tokenizer.bos_token_id and doc[-1] == tokenizer.eos_token_id
        body = doc[1:-1]
        half = (len(body) - len(blank)) // 2
        if body[:half] + blank + body[:half] == body:  # passage, blank, passage
            passage = body[:half]
            plain += 1
        else:  # the chat form: the assistant's answer is the passage of the user's turn
            cut = max(i for i in range(len(body)) if body[i: i + len(assistant)] == assistant)
            passage = body[cut + len(assistant):]
            assert body[: len(user)] == user and body[len(user): len(user) + len(passage)] == passage
        assert 16 <= len(passage) <= 200
        random += not set(passage) <= set(range(100, 140))
    assert plain and plain < len(docs)  # both forms
    assert 0.3 < random / len(docs) < 0.7  # random_share of the passages are random ids
