"""`kvdeck --serve --speculative-config ...`: streams speculative output (several tokens per
chunk), equal to plain greedy output, and /metrics exports vLLM's spec_decode counters."""

import json
import time

import openai
import pytest

from kvdeck import LLM, SamplingParams
from tests.serve.conftest import KV_GIB, start_server, stop_server
from tests.serve.test_openai_api import metrics

pytestmark = pytest.mark.timeout(180)
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    # The model is its own draft: every greedy draft is accepted, so each step emits k + 1.
    config = json.dumps({"model": str(serve_model_dir), "num_speculative_tokens": 4})
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("spec_logs"), "--speculative-config", config)
    yield live
    stop_server(live)


def test_streams_speculative_output_and_the_metrics_move(server, serve_model_dir):
    api = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    model = api.models.list().data[0].id
    stream = api.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                    stream=True, stream_options={"include_usage": True})
    chunks, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            chunks.append(chunk.choices[0].text)
        usage = chunk.usage or usage
    with LLM(str(serve_model_dir), kv_cache_memory_gib=float(KV_GIB)) as llm:
        expected = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24))[0].outputs[0]
    assert "".join(chunks) == expected.text
    assert usage.completion_tokens == len(expected.token_ids)
    assert len(chunks) < usage.completion_tokens  # several tokens arrived per chunk
    deadline = time.monotonic() + 10
    while (m := metrics(server)).get("vllm:spec_decode_num_drafts_total{}", 0) == 0:
        assert time.monotonic() < deadline, "the spec_decode counters never moved"
        time.sleep(0.2)
    assert m["vllm:spec_decode_num_draft_tokens_total{}"] >= m["vllm:spec_decode_num_drafts_total{}"]
    assert m["vllm:spec_decode_num_accepted_tokens_total{}"] > 0
    assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total{position=0}"] > 0
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=3}" in m

