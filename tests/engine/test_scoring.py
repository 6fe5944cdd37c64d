"""`sequence_logits` (quality measurements through the paged cache) equals transformers'
logits, for a hybrid windowed model too, and an 8-bit cache changes them a little."""

import torch

from kvdeck import LLM
from kvdeck.engine.runner.scoring import sequence_logits
from tests.model_factory import build_tiny_model

IDS = [(7 * i) % 300 + 3 for i in range(70)]


def test_logits_match_transformers_and_8_bit_cache_rounds(tmp_path):
    import transformers as tf

    model_dir = build_tiny_model(tmp_path, "gemma2", sliding_window=20)
    reference = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([IDS])).logits[0]
    exact = sequence_logits(LLM(str(model_dir), kv_cache_memory_gib=0.01).engine.core.runner, IDS)
    torch.testing.assert_close(exact, expected, atol=2e-4, rtol=2e-4)
    rounded = sequence_logits(LLM(str(model_dir), kv_cache_memory_gib=0.01,
                                  kv_cache_dtype="int8").engine.core.runner, IDS)
    error = (rounded - expected).abs().max().item()
    assert 1e-4 < error < 0.5, error
