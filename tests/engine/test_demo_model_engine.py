"""The bundled demo model through the engine: the default model, equal to transformers."""

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.model_path import demo_model_dir
from tests.model_factory import hf_greedy


def test_default_model_is_the_demo_and_matches_transformers():
    llm = LLM(kv_cache_memory_gib=0.02)  # no model given: the bundled demo model
    assert llm.engine.core.model_dir == demo_model_dir()
    tok = llm.get_tokenizer()
    prompts = ["Return a", "The json module", "def open(file, mode='r'):\n    \"\"\""]
    ids = [tok.encode(p) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    assert got == hf_greedy(demo_model_dir(), ids, 16)


def test_demo_model_chats_in_words():
    llm = LLM(kv_cache_memory_gib=0.02)
    out = llm.chat([{"role": "user", "content": "What does json.dumps do?"}],
                   SamplingParams(temperature=0.7, top_p=0.9, seed=0, max_tokens=48))[0]
    text = out.outputs[0].text
    words = [w for w in text.split() if w.isalpha()]
    assert len(words) >= 5, text
    assert out.outputs[0].finish_reason in ("stop", "length")
