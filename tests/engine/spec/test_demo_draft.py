"""The bundled draft (assets/demo_draft, `"model": "demo-draft"`) works offline with the bundled
demo model: it loads by name, shares the demo's vocabulary, gives plain greedy output, and
agrees with the demo model often enough to be worth running."""

from kvdeck import LLM, SamplingParams
from kvdeck.assets import demo_draft_dir

PROMPTS = ["Return the number of items in the container.",
           "def read(self, size=-1):\n    \"\"\"Read up to size bytes",
           "The module provides functions for"]


def test_demo_draft_is_bundled_and_accepted_often():
    assert (demo_draft_dir() / "model.safetensors").is_file()
    size = sum(f.stat().st_size for f in demo_draft_dir().iterdir())
    assert size < 5_000_000, f"the bundled draft grew to {size} bytes"
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    with LLM(kv_cache_memory_gib=0.02) as llm:
        plain = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    config = {"model": "demo-draft", "num_speculative_tokens": 3}
    with LLM(kv_cache_memory_gib=0.02, speculative_config=config) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
        spec = llm.stats().spec
    assert got == plain
    assert spec.method == "draft_model" and spec.num_drafts > 0
    # Measured when it was trained (training.json): well above what a random draft gets.
    assert spec.acceptance_rate > 0.3, spec
