"""speculative_config: vLLM's JSON, validated in the light config; the CLI parses it."""

import pytest

from kvdeck.app.cli import build_parser, engine_kwargs_from_args
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.speculative import CPU_BF16_EXACT_MAX_DRAFT, SUFFIX_DEFAULT_DRAFT, SpeculativeConfig
from kvdeck.kernels.cpu.native import BF16_STACK_MAX_ROWS


def test_ngram_and_draft_forms_parse():
    ngram = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4,
                                         "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    assert (ngram.method, ngram.num_speculative_tokens, ngram.prompt_lookup_max) == ("ngram", 4, 5)
    draft = SpeculativeConfig.from_dict({"model": "some/draft", "num_speculative_tokens": 3})
    assert draft.method == "draft_model" and draft.model == "some/draft"
    assert SpeculativeConfig.from_dict({"method": "draft_model", "model": "d",
                                        "num_speculative_tokens": 1}).method == "draft_model"
    config = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                              "disable_by_batch_size": 8})
    assert config.speculative.disable_by_batch_size == 8


@pytest.mark.parametrize("raw, field", [
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
      "prompt_lookup_max": 3}, "prompt_lookup_max"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
    ({"num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "takes no 'model'"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "typo"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0},
     "disable_by_batch_size"),
    ({"method": "ngram", "num_speculative_tokens": 2, "min_acceptance_rate": 1.5},
     "min_acceptance_rate"),
    ("ngram", "JSON object"),
])
def test_bad_configs_name_the_field(raw, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(speculative_config=raw)


def test_suffix_defaults_are_vllms_but_the_cache_size_and_the_draft_length():
    suffix = SpeculativeConfig.from_dict({"method": "suffix"})
    assert (suffix.suffix_decoding_max_tree_depth, suffix.suffix_decoding_max_cached_requests,
            suffix.suffix_decoding_max_spec_factor,
            suffix.suffix_decoding_min_token_prob) == (24, 1000, 1.0, 0.1)
    # seven drafts: the most a bf16 CPU decoder stack verifies bit for bit (vLLM: the depth)
    assert suffix.num_speculative_tokens == SUFFIX_DEFAULT_DRAFT == CPU_BF16_EXACT_MAX_DRAFT \
        == BF16_STACK_MAX_ROWS - 1
    longest = SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 16})
    assert longest.num_speculative_tokens == 16
    shallow = SpeculativeConfig.from_dict({"method": "suffix", "suffix_decoding_max_tree_depth": 6})
    assert shallow.num_speculative_tokens == 6


@pytest.mark.parametrize("key, value", [
    ("suffix_decoding_max_tree_depth", 0),
    ("suffix_decoding_max_tree_depth", 2.5),
    ("suffix_decoding_max_cached_requests", -1),
    ("suffix_decoding_max_spec_factor", -0.5),
    ("suffix_decoding_max_spec_factor", "2"),
    ("suffix_decoding_min_token_prob", 1.5),
    ("suffix_decoding_min_token_prob", True),
])
def test_bad_suffix_keys_are_named(key, value):
    with pytest.raises(ValueError, match=key):
        EngineConfig(speculative_config={"method": "suffix", key: value})


def test_suffix_keys_belong_to_suffix():
    with pytest.raises(ValueError, match="suffix_decoding_min_token_prob belong"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2,
                                     "suffix_decoding_min_token_prob": 0.2})
    with pytest.raises(ValueError, match="takes no 'model'"):
        SpeculativeConfig.from_dict({"method": "suffix", "model": "x"})


def test_cli_flag_takes_json():
    argv = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    kwargs = engine_kwargs_from_args(build_parser(argv).parse_args(argv))
    assert kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(SystemExit):
        build_parser(["--speculative-config", "{not json"]).parse_args(
            ["--speculative-config", "{not json"])
