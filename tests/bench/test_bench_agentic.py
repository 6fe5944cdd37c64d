"""The agentic workload: seeded transcripts of JSON tool calls that end where the next call
goes; `kvdeck bench decode --workload agentic` with suffix decoding end to end."""

import json

from kvdeck.app.bench.agentic import HEADER, agentic_prompts
from kvdeck.app.cli import main
from kvdeck.engine.frontend.tokenizer import load_tokenizer


def test_prompts_are_seeded_transcripts_of_tool_calls(tiny_llama_dir):
    tokenizer = load_tokenizer(tiny_llama_dir, None, required=True)
    prompts = agentic_prompts(tokenizer, 3, 1000, seed=1)  # a tiny tokenizer: ~10 lines
    assert [len(p) for p in prompts] == [1000, 1000, 1000]
    assert prompts == agentic_prompts(tokenizer, 3, 1000, seed=1)
    assert len({tuple(p) for p in prompts}) == 3  # each request its own transcript
    for prompt in prompts:
        text = tokenizer.decode(prompt, skip_special_tokens=True)
        assert text.startswith(HEADER) and text.endswith("\n")
        lines = text[len(HEADER):].splitlines()
        assert lines[-1].startswith("RESULT ")  # the agent's next call comes next
        calls = [json.loads(line) for line in lines[1:] if not line.startswith("RESULT ")]
        assert calls and all(set(call) == {"tool", "args"} for call in calls)


def test_decode_comparison_with_suffix_decoding(tiny_llama_dir, tmp_path):
    out = tmp_path / "d.json"
    config = '{"method": "suffix", "num_speculative_tokens": 8}'
    assert main(["bench", "decode", "--model", str(tiny_llama_dir), "--workload", "agentic",
                 "--input-len", "200", "--output-len", "16", "--repeats", "2",
                 "--kv-cache-memory-gib", "0.01", "--speculative-config", config, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["workload"] == "agentic"
    assert result["greedy_outputs_identical"] is True
