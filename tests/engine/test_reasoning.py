"""Reasoning apart from the answer (`<think> ... </think>`, vLLM's qwen3 and deepseek_r1
parsers): the split of whole replies, and a streamed reply's parts never taking text back."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvdeck.engine.frontend.reasoning import (
    REASONING_FORMATS,
    ReasoningStream,
    detect_reasoning_format,
    reasoning_format,
    split_reasoning,
)

QWEN3, R1 = REASONING_FORMATS["qwen3"], REASONING_FORMATS["deepseek_r1"]


@pytest.mark.parametrize(("fmt", "text", "expected"), [
    (QWEN3, "<think>\nLet me add.\n</think>\n\nIt is 4.", ("Let me add.", "It is 4.")),
    (QWEN3, "It is 4.", ("", "It is 4.")),  # enable_thinking=False: no block
    (QWEN3, "<think>\n\n</think>\n\nIt is 4.", ("", "It is 4.")),  # an empty block
    (QWEN3, "<think>\nstill thinking", ("still thinking", "")),  # cut by max_tokens
    (QWEN3, "2 < 3 and <think> later", ("", "2 < 3 and <think> later")),  # not at the start
    (R1, "Let me add.\n</think>\n\nIt is 4.", ("Let me add.", "It is 4.")),  # opened in the prompt
    (R1, "<think>Let me add.</think>It is 4.", ("Let me add.", "It is 4.")),
    (R1, "no end tag at all", ("no end tag at all", "")),
    (QWEN3, "<think>a</think>b</think>c", ("a", "b</think>c")),  # the first end tag ends it
])
def test_whole_replies(fmt, text, expected):
    assert split_reasoning(fmt, text, finished=True) == expected


PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "</thi", "nk>", "\n", " ", "a",
                          "b c", "ink"])


@settings(max_examples=300, deadline=None)
@given(fmt=st.sampled_from([QWEN3, R1]), pieces=st.lists(PIECES, max_size=12),
       cuts=st.lists(st.integers(0, 60), max_size=6))
def test_a_stream_never_takes_text_back_and_ends_as_the_whole_reply(fmt, pieces, cuts):
    text = "".join(pieces)
    stream = ReasoningStream(fmt)
    reasoning = answer = ""
    for end in sorted({min(c, len(text)) for c in cuts}):
        new_reasoning, new_answer, so_far = stream.update(text[:end], finished=False)
        reasoning, answer = reasoning + new_reasoning, answer + new_answer
        assert so_far == answer
        whole = split_reasoning(fmt, text[:end], finished=False)
        assert whole == (reasoning, answer)
    new_reasoning, new_answer, _ = stream.update(text, finished=True)
    assert (reasoning + new_reasoning, answer + new_answer) == split_reasoning(fmt, text, True)


def test_a_tag_cut_between_two_outputs_is_held_back():
    stream = ReasoningStream(QWEN3)
    assert stream.update("<thi", False) == ("", "", "")
    assert stream.update("<think>\nHmm </thi", False) == ("Hmm", "", "")
    assert stream.update("<think>\nHmm </think>\n\n", False) == ("", "", "")
    assert stream.update("<think>\nHmm </think>\n\nYes", False) == ("", "Yes", "Yes")


def test_an_unknown_parser_is_named():
    with pytest.raises(ValueError, match="unknown reasoning parser 'r2'; kvdeck has qwen3, deepseek_r1"):
        reasoning_format("r2")


@pytest.mark.parametrize(("template", "expected"), [
    # Qwen3's shape: the switch closes an empty block; the model opens its own otherwise
    ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
     "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
     "<think>\n\n</think>\n\n{% endif %}", "qwen3"),
    # DeepSeek-R1's distills and QwQ: the prompt opens the block
    ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|Assistant|><think>\n",
     "deepseek_r1"),
    ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>", None),
])
def test_the_format_is_read_from_the_chat_template(tmp_path, template, expected):
    from tests.model_factory import build_tokenizer

    tokenizer = build_tokenizer(tmp_path)
    tokenizer.chat_template = template
    found = detect_reasoning_format(tokenizer)
    assert (found.name if found else None) == expected
    assert detect_reasoning_format(object()) is None  # no template at all
