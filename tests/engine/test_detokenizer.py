"""Incremental detokenisation: UTF-8 never split, stop strings across token boundaries."""

import pytest

from kvdeck.engine.frontend.detokenizer import IncrementalDetokenizer
from tests.model_factory import build_tokenizer

TEXT = "Héllo wörld, ça va? 日本語のテキスト and emoji 🙂🙂 done."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=300)


def test_streamed_deltas_never_split_a_character(tokenizer):
    ids = tokenizer.encode(TEXT)
    # Byte-level BPE: some tokens hold only part of a multi-byte character.
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:"))
    deltas = [detok.add_tokens([t], finished=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_across_tokens_is_cut_and_never_streamed(tokenizer):
    ids = tokenizer.encode(TEXT)
    detok = IncrementalDetokenizer(tokenizer, [1], stop=["ça va"])
    streamed = ""
    for t in ids:
        streamed += detok.add_tokens([t], finished=False)
        if detok.stop_reason:
            break
    assert detok.stop_reason == "ça va"
    assert streamed == "Héllo wörld, "
    assert detok.text == "Héllo wörld, "


def test_include_stop_string(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [1], stop=["wörld"], include_stop_str_in_output=True)
    out = detok.add_tokens(tokenizer.encode(TEXT), finished=False)
    assert out == "Héllo wörld" and detok.stop_reason == "wörld"


def test_stop_strings_through_the_engine(tiny_llama_dir):
    from kvdeck import LLM, SamplingParams

    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)
    free = llm.generate("The quick", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    text = free[0].outputs[0].text
    # A clean two-character piece that first occurs after the start of the text.
    start = next(i for i in range(1, len(text) - 1)
                 if "\ufffd" not in text[i : i + 2] and text.index(text[i : i + 2]) == i)
    stop = text[start : start + 2]
    out = llm.generate("The quick", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                   stop=[stop]))[0]
    assert out.outputs[0].text == text[: text.index(stop)]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert llm.stats().kv_cache_usage == 0 and llm.stats().num_running == 0


def test_a_fast_tokenizer_decodes_on_its_backend_with_the_same_text(tokenizer, monkeypatch):
    """Where transformers' decode is only its backend's (a fast tokenizer, no clean-up), the
    detokenizer calls the backend directly; the text streamed is the same either way, and
    a tokenizer that cleans up spaces keeps its own decode."""
    assert tokenizer.clean_up_tokenization_spaces is False
    ids = tokenizer.encode(TEXT)
    fast = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:"))
    assert fast._decode == tokenizer.backend_tokenizer.decode
    deltas = [fast.add_tokens([t], finished=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(deltas) == TEXT
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    assert IncrementalDetokenizer(tokenizer, [1])._decode == tokenizer.decode
