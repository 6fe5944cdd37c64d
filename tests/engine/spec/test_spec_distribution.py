"""At temperature 1, speculative decoding samples from the same distribution as plain
decoding: the tokens at each position, over many requests, pass a chi-square homogeneity
test against non-speculative samples (and the test itself tells the draft's own samples
apart from the target's)."""

from collections import Counter

import pytest

from kvdeck import LLM, SamplingParams
from tests.engine.spec.chi_square import homogeneity

PROMPT = "def add(a, b):\n    return a + b\n" * 2
SAMPLES = 1000
POSITIONS = (1, 2, 3)  # token 0 comes from the prefill, before any speculation


def _samples(path, **engine) -> tuple[list[Counter], object]:
    params = SamplingParams(temperature=1.0, max_tokens=max(POSITIONS) + 1, ignore_eos=True,
                            detokenize=False)
    with LLM(str(path), kv_cache_memory_gib=0.02, seed=5, **engine) as llm:
        outputs = llm.generate([PROMPT] * SAMPLES, params)
        stats = llm.stats()
    # The marginal distribution of the token at each position (a mixture over what came before).
    return [Counter(o.outputs[0].token_ids[pos] for o in outputs) for pos in POSITIONS], stats


@pytest.fixture(scope="module")
def plain(sharp_llama_dirs):
    return _samples(sharp_llama_dirs[0])[0]


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_speculative_samples_match_plain_ones(sharp_llama_dirs, plain, proposer):
    target, draft = sharp_llama_dirs
    config = ({"model": str(draft), "num_speculative_tokens": 3} if proposer == "draft"
              else {"method": "ngram", "num_speculative_tokens": 3})
    counts, stats = _samples(target, speculative_config={**config, "disable_by_batch_size": None})
    spec = stats.spec
    assert spec.num_drafts > SAMPLES // 10 and 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    for pos, mine, theirs in zip(POSITIONS, counts, plain):
        assert homogeneity(mine, theirs) > 0.01, pos


def test_the_test_tells_the_draft_from_the_target(sharp_llama_dirs, plain):
    counts, _ = _samples(sharp_llama_dirs[1])
    assert min(homogeneity(mine, theirs) for mine, theirs in zip(counts, plain)) < 1e-4
