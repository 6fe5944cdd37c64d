"""Structured outputs with speculative decoding on: a constrained request decodes one token a
step under its grammar (drafts would skip the mask), while unconstrained requests beside it
still speculate and keep their plain greedy output."""

import re

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.structured import StructuredOutputsParams as Spec

PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n" * 3]
REGEX = r"[0-9]{3}-[0-9]{4}"


def test_constrained_requests_do_not_speculate(tiny_model_dirs, tiny_draft_dirs):
    path = tiny_model_dirs["llama"]
    plain_params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=16, structured_outputs=Spec(regex=REGEX))
    with LLM(str(path), kv_cache_memory_gib=0.01) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, plain_params)]
    config = {"model": str(tiny_draft_dirs["llama"]), "num_speculative_tokens": 3}
    with LLM(str(path), kv_cache_memory_gib=0.01, speculative_config=config) as llm:
        outputs = llm.generate([*PROMPTS, "Call me at"], [plain_params, plain_params, constrained])
        spec = llm.stats().spec
    assert [o.outputs[0].token_ids for o in outputs[:2]] == plain
    assert re.fullmatch(REGEX, outputs[2].outputs[0].text), outputs[2].outputs[0].text
    assert spec.num_drafts > 0
