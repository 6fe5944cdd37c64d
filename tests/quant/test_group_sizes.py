"""AWQ group sizes 32/64/128 (AutoAWQ's): the default is the largest that divides every
quantised layer's input width, the checkpoint records it, the engine runs it; and
round-to-nearest (`--method rtn`) writes the same layout without calibration."""

import json
from types import SimpleNamespace

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.app.cli import main
from kvdeck.quant.awq_quantizer import default_group_size
from tests.model_factory import build_tiny_model


def config(hidden: int, intermediate: int, heads: int = 4, head_dim: int | None = None):
    return SimpleNamespace(hidden_size=hidden, intermediate_size=intermediate,
                           num_attention_heads=heads, head_dim=head_dim or hidden // heads)


@pytest.mark.parametrize(("hidden", "intermediate", "expected"), [
    (4096, 14336, 128), (576, 1536, 64), (96, 192, 32), (64, 128, 64)])
def test_default_group_size(hidden, intermediate, expected):
    assert default_group_size(config(hidden, intermediate)) == expected


def test_no_group_size_fits():
    with pytest.raises(ValueError, match="no AWQ group size"):
        default_group_size(config(100, 200))


@pytest.fixture(scope="module")
def width_96_model(tmp_path_factory):
    # 96 is divisible by 32 but not by 64: only the smallest group size fits.
    return build_tiny_model(tmp_path_factory.mktemp("w96") / "llama", "llama", hidden_size=96,
                            intermediate_size=192, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("method", ["rtn", "awq"])
def test_quantize_picks_the_group_size_and_the_engine_runs_it(width_96_model, tmp_path, method):
    out = tmp_path / method
    args = ["quantize", str(width_96_model), "--method", method, "--out", str(out), "--device", "cpu"]
    if method == "awq":
        args += ["--num-samples", "4", "--seq-len", "64"]
    assert main(args) == 0
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "awq" and quant["group_size"] == 32
    with LLM(str(out), kv_cache_memory_gib=0.01) as int4, \
            LLM(str(width_96_model), kv_cache_memory_gib=0.01) as dense:
        prompt = [5, 9, 13, 21]
        greedy = SamplingParams(temperature=0, max_tokens=1)
        logits = []
        for llm in (int4, dense):
            (out_,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=20))
            logits.append(out_.outputs[0].logprobs[0])
        assert int4.generate([prompt], greedy)[0].outputs[0].token_ids
        # INT4 at group 32 stays close to the dense model: their top tokens overlap.
        top_int4 = set(logits[0]) & set(logits[1])
        assert len(top_int4) >= 10


def test_a_group_size_that_does_not_divide_is_refused(width_96_model, tmp_path, capsys):
    code = main(["quantize", str(width_96_model), "--method", "rtn", "--group-size", "64",
                 "--out", str(tmp_path / "x")])
    assert code == 2 and "not divisible by the AWQ group size 64" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
