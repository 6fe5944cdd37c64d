"""Embeddings (LLM.embed, SamplingParams.embed): the last prompt token's final hidden state,
L2-normalised, equal to transformers' `last_hidden_state` over chunked prefill, from the
prefix cache and beside generating requests in the same steps."""

import pytest
import torch
import transformers

from kvdeck import LLM, SamplingParams

PROMPTS = [[(7 * i + 3) % 250 + 5 for i in range(70)],  # chunked: more than the step's 32 tokens
           [(5 * i + 1) % 200 + 7 for i in range(9)],
           [42]]


def reference(model_dir, prompt: list[int]) -> torch.Tensor:
    model = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([prompt])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_embeddings_equal_transformers_chunked_cached_and_beside_generation(tiny_model_dirs, family):
    model_dir = tiny_model_dirs[family]
    with LLM(str(model_dir), max_num_batched_tokens=32, kv_cache_memory_gib=0.01, max_model_len=160,
             enable_prefix_caching=True) as llm:
        expected = [reference(model_dir, prompt) for prompt in PROMPTS]
        first = llm.embed(PROMPTS)
        for out, prompt, want in zip(first, PROMPTS, expected, strict=True):
            got = torch.tensor(out.outputs.embedding)
            assert out.prompt_token_ids == prompt and got.shape == want.shape
            assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
            assert got.norm().item() == pytest.approx(1.0, abs=1e-5)
        # Again: the long prompt's blocks come from the prefix cache, its last token is computed.
        hits = llm.stats().prefix_cache_hits
        again = llm.embed(PROMPTS[:1])[0]
        assert llm.stats().prefix_cache_hits > hits
        assert torch.allclose(torch.tensor(again.outputs.embedding), expected[0], atol=1e-5)
        # Embedding and generating requests share steps; neither changes the other.
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        alone = llm.generate(PROMPTS[1:2], params)[0].outputs[0].token_ids
        embed_params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, detokenize=False,
                                      embed=True)
        mixed = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [params, embed_params, embed_params])
        assert mixed[0].outputs[0].token_ids == alone and mixed[0].embedding is None
        for out, want in zip(mixed[1:], (expected[0], expected[2])):
            assert torch.allclose(torch.tensor(out.embedding), want, atol=1e-5)
        stats = llm.stats()
        assert stats.num_running == 0 and stats.num_free_blocks == stats.num_blocks  # nothing leaked
