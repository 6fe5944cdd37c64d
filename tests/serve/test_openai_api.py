"""The official openai client against a live `kvdeck --serve`, checked against the offline LLM."""

import asyncio
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvdeck import LLM, SamplingParams
from tests.serve.conftest import KV_GIB, start_server, stop_server

pytestmark = pytest.mark.timeout(120)

PROMPTS = ["The quick brown fox", "Paged attention stores", "def add(a, b):"]
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is prefix caching?"}]


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("serve_logs"))
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model_name(api) -> str:
    return api.models.list().data[0].id


@pytest.fixture(scope="module")
def offline(serve_model_dir) -> LLM:
    return LLM(str(serve_model_dir), kv_cache_memory_gib=float(KV_GIB))


def metrics(server) -> dict[str, float]:
    """Every sample as 'name{label=value,...}' -> value (model_name label left out)."""
    text = httpx.get(f"{server.base_url}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def wait_idle(server, timeout: float = 10.0, settled=lambda m: True) -> dict[str, float]:
    """The metrics once the engine is idle, `settled(metrics)` holds and nothing moves for
    a while: what the engine's stats snapshots report (the prefix-cache counters, the
    gauges) arrives at their rate, up to 1/STATS_HZ after the step (the token counters
    come with the outputs), so an idle reading can still lack the last request's."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(server)
        idle = m["vllm:num_requests_running{}"] == 0 and m["vllm:num_requests_waiting{}"] == 0
        if idle and m["vllm:kv_cache_usage_perc{}"] == 0 and settled(m):
            time.sleep(0.3)  # several snapshot intervals
            again = metrics(server)
            engine = [key for key in again if key.startswith(("vllm:", "kvdeck:"))]
            if all(again[key] == m.get(key) for key in engine) or time.monotonic() > deadline:
                return again
        elif time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_health_and_models(server, api, serve_model_dir):
    health = httpx.get(f"{server.base_url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    models = api.models.list().data
    assert [m.id for m in models] == [serve_model_dir.name]  # the folder's name, not its path
    by_path = api.completions.create(model=str(serve_model_dir), prompt="hi", max_tokens=1)
    assert by_path.model == serve_model_dir.name
    # models.retrieve, by the served name or an alias (the path, slashes and all)
    assert api.models.retrieve(serve_model_dir.name) == models[0]
    assert api.models.retrieve(str(serve_model_dir)).id == serve_model_dir.name
    with pytest.raises(openai.NotFoundError, match="does not exist") as missing:
        api.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"


def test_completion_equals_offline_greedy(api, model_name, offline):
    expected = offline.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12))
    for prompt, want in zip(PROMPTS, expected, strict=True):
        got = api.completions.create(model=model_name, prompt=prompt, max_tokens=12,
                                     temperature=0)
        assert got.choices[0].text == want.outputs[0].text
        assert got.choices[0].finish_reason == want.outputs[0].finish_reason
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.usage.completion_tokens == len(want.outputs[0].token_ids)
        assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens


def test_completion_stream_equals_non_stream(api, model_name):
    whole = api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=20,
                                   temperature=0, extra_body={"ignore_eos": True})
    chunks = list(api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=20,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True},
                                         extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_equals_offline_greedy(api, model_name, offline):
    want = offline.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=16))[0]
    got = api.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=16,
                                      temperature=0)
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.outputs[0].text
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    assert got.usage.completion_tokens == len(want.outputs[0].token_ids)


def test_chat_stream(api, model_name):
    whole = api.chat.completions.create(model=model_name, messages=MESSAGES, temperature=0,
                                        max_completion_tokens=10)
    stream = api.chat.completions.create(model=model_name, messages=MESSAGES, temperature=0,
                                         max_completion_tokens=10, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_stop_string_cuts_the_text(api, model_name):
    free = api.completions.create(model=model_name, prompt=PROMPTS[1], max_tokens=24,
                                  temperature=0, extra_body={"ignore_eos": True})
    text = free.choices[0].text
    stop = text[6:9]
    assert len(stop) == 3
    for stream in (False, True):
        got = api.completions.create(model=model_name, prompt=PROMPTS[1], max_tokens=24,
                                     temperature=0, stop=[stop], stream=stream,
                                     extra_body={"ignore_eos": True})
        if stream:
            chunks = list(got)
            out = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            out, reason = got.choices[0].text, got.choices[0].finish_reason
        assert out == text[: text.index(stop)]
        assert reason == "stop"


def test_seed_reproducibility(api, model_name):
    def sample(seed: int) -> str:
        return api.completions.create(model=model_name, prompt=PROMPTS[2], max_tokens=16,
                                      temperature=1.0, seed=seed,
                                      extra_body={"ignore_eos": True}).choices[0].text

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other


def test_n_choices_match_the_offline_engine(api, model_name, offline):
    # Choice i*n + j is prompt i's choice j, sampled with seed + j: the same as the
    # offline LLM's n > 1, and a prompt's tokens count once in usage.
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=10, ignore_eos=True)
    want = offline.generate(PROMPTS[:2], params)
    got = api.completions.create(model=model_name, prompt=PROMPTS[:2], n=3, temperature=1.0,
                                 seed=11, max_tokens=10, extra_body={"ignore_eos": True})
    assert [c.index for c in got.choices] == list(range(6))
    assert [c.text for c in got.choices] == [c.text for out in want for c in out.outputs]
    assert len({c.text for c in got.choices[:3]}) == 3  # the choices differ
    assert got.usage.prompt_tokens == sum(len(out.prompt_token_ids) for out in want)
    assert got.usage.completion_tokens == 60
    chunks = list(api.completions.create(model=model_name, prompt=PROMPTS[:2], n=3,
                                         temperature=1.0, seed=11, max_tokens=10, stream=True,
                                         stream_options={"include_usage": True},
                                         extra_body={"ignore_eos": True}))
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(6)]
    assert streamed == [c.text for c in got.choices]
    assert chunks[-1].usage.prompt_tokens == got.usage.prompt_tokens


def test_n_chat_choices_stream_and_not(api, model_name, offline):
    want = offline.chat(MESSAGES, SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=8))[0]
    whole = api.chat.completions.create(model=model_name, messages=MESSAGES, n=2, seed=5,
                                        temperature=1.0, max_tokens=8)
    assert [c.message.content for c in whole.choices] == [c.text for c in want.outputs]
    assert whole.usage.prompt_tokens == len(want.prompt_token_ids)
    chunks = list(api.chat.completions.create(model=model_name, messages=MESSAGES, n=2, seed=5,
                                              temperature=1.0, max_tokens=8, stream=True))
    assert {c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"} == {0, 1}
    for i, choice in enumerate(whole.choices):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert "".join(part.delta.content or "" for part in mine) == choice.message.content
        assert [part.finish_reason for part in mine if part.finish_reason] == [choice.finish_reason]


def test_logprobs(api, model_name):
    chat = api.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        # greedy: the sampled token is the most likely one
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
    comp = api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=5,
                                  temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == comp.choices[0].text


def test_echo_with_max_tokens_0_scores_the_prompt(api, model_name, offline):
    """How lm-evaluation-harness scores a text: the prompt back with its tokens' logprobs."""
    got = api.completions.create(model=model_name, prompt=PROMPTS[1], max_tokens=0, echo=True,
                                 logprobs=1)
    choice = got.choices[0]
    assert choice.text == PROMPTS[1] and choice.finish_reason == "length"
    assert got.usage.completion_tokens == 0
    want = offline.generate(PROMPTS[1], SamplingParams(max_tokens=1, prompt_logprobs=1))[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == PROMPTS[1] and len(lp.tokens) == got.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts it
    expected = [entry[token].logprob for token, entry in zip(want.prompt_token_ids[1:],
                                                             want.prompt_logprobs[1:], strict=True)]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs[1:])
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]


def test_echo_stream_equals_non_stream(api, model_name, offline):
    args = dict(model=model_name, prompt=[PROMPTS[0], PROMPTS[2]], max_tokens=6, temperature=0,
                echo=True, logprobs=0, extra_body={"ignore_eos": True})
    whole = api.completions.create(**args)
    chunks = [c.choices[0] for c in api.completions.create(**args, stream=True) if c.choices]
    for index, prompt in enumerate([PROMPTS[0], PROMPTS[2]]):
        mine = [c for c in chunks if c.index == index]
        assert mine[0].text.startswith(prompt)
        assert "".join(c.text for c in mine) == whole.choices[index].text
        tokens = [t for c in mine for t in c.logprobs.tokens]
        assert tokens == whole.choices[index].logprobs.tokens
        assert len(tokens) == len(offline.get_tokenizer().encode(prompt)) + 6  # the prompt's, then 6
    alone = [c.choices for c in api.completions.create(
        model=model_name, prompt=PROMPTS[0], max_tokens=0, echo=True, stream=True,
        stream_options={"include_usage": True})]
    assert [(c[0].text, c[0].finish_reason) for c in alone if c] == [(PROMPTS[0], "length")]


def test_prompt_logprobs_on_both_endpoints(api, model_name):
    comp = api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=2,
                                  extra_body={"prompt_logprobs": 2})
    entries = comp.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == comp.usage.prompt_tokens
    for entry in entries[1:]:
        ranks = sorted(item["rank"] for item in entry.values())
        assert ranks[:2] == [1, 2] and all(item["logprob"] <= 0 for item in entry.values())
    chat = api.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=2,
                                       extra_body={"prompt_logprobs": 0})
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs is not available with stream"):
        api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=2, stream=True,
                               extra_body={"prompt_logprobs": 1})
    with pytest.raises(openai.BadRequestError, match="0 is for echo"):
        api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=0)


def test_logit_bias_on_both_endpoints(api, model_name):
    forced = api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=4, temperature=0,
                                    logit_bias={"42": 100}, extra_body={"return_token_ids": True,
                                                                        "ignore_eos": True})
    assert forced.choices[0].model_extra["token_ids"] == [42] * 4
    plain = api.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3, temperature=0,
                                        extra_body={"return_token_ids": True})
    first = plain.choices[0].model_extra["token_ids"][0]
    banned = api.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3, temperature=0,
                                         logit_bias={str(first): -100}, extra_body={"return_token_ids": True})
    assert banned.choices[0].model_extra["token_ids"][0] != first


def test_tokenize_detokenize(server, api, model_name):
    tok = httpx.post(f"{server.base_url}/tokenize", json={"prompt": PROMPTS[0]}).json()
    assert tok["count"] == len(tok["tokens"]) > 0
    detok = httpx.post(f"{server.base_url}/detokenize", json={"tokens": tok["tokens"]}).json()
    assert detok["prompt"] == PROMPTS[0]
    usage = api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=1).usage
    assert usage.prompt_tokens == tok["count"]
    chat_tok = httpx.post(f"{server.base_url}/tokenize", json={"messages": MESSAGES}).json()
    chat = api.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=1)
    assert chat.usage.prompt_tokens == chat_tok["count"]


def test_metrics_move_and_settle(server, api, model_name):
    before = wait_idle(server)
    out = api.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=7,
                                 temperature=0, extra_body={"ignore_eos": True})
    queries = "vllm:prefix_cache_queries_total{}"
    after = wait_idle(server, settled=lambda m: m.get(queries, 0.0) > before.get(queries, 0.0))
    assert after["vllm:kv_cache_usage_perc{}"] == 0
    assert after["vllm:num_requests_running{}"] == 0
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta["vllm:generation_tokens_total{}"] == 7
    assert delta["vllm:prompt_tokens_total{}"] == out.usage.prompt_tokens
    assert delta["vllm:request_success_total{finished_reason=length}"] == 1
    assert delta["vllm:prefix_cache_queries_total{}"] == out.usage.prompt_tokens
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                      "request_queue_time_seconds"):
        assert delta[f"vllm:{histogram}_count{{}}"] == 1
    assert delta["vllm:inter_token_latency_seconds_count{}"] == 6
    assert after["vllm:e2e_request_latency_seconds_sum{}"] > 0
    assert after["kvdeck:num_kv_blocks{}"] > 0
    assert delta["kvdeck:kernel_compiles_total{}"] == 0  # the CPU engine compiles no kernel
    assert not any("spec_decode" in name for name in after)  # only with --speculative-config


async def test_64_concurrent_streams(server, model_name, offline):
    prompts = [f"request {i}: {PROMPTS[i % 3]}" for i in range(64)]
    expected = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=16,
                                                        ignore_eos=True))
    api = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                             http_client=httpx.AsyncClient(limits=httpx.Limits(
                                 max_connections=100)))

    async def one(prompt: str) -> tuple[str, int, str]:
        stream = await api.completions.create(model=model_name, prompt=prompt, max_tokens=16,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True},
                                              extra_body={"ignore_eos": True})
        text, usage, reason = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return text, usage, reason

    results = await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 90)
    await api.close()
    assert [r[0] for r in results] == [e.outputs[0].text for e in expected]
    assert all(r[1] == 16 and r[2] == "length" for r in results)
    assert wait_idle(server)["vllm:kv_cache_usage_perc{}"] == 0


def test_disconnect_mid_stream_aborts(server, api, model_name):
    before = wait_idle(server)
    body = {"model": model_name, "prompt": PROMPTS[0], "max_tokens": 480, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.base_url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()  # kept referenced: dropping it closes the stream
            received = 0
            while received < 3:
                received += next(lines).startswith("data: {")
            # while it runs, the engine holds blocks for it (stats arrive ~15 times a second)
            deadline = time.monotonic() + 5
            while metrics(server)["vllm:kv_cache_usage_perc{}"] == 0:
                assert time.monotonic() < deadline, "the running request holds no blocks"
                time.sleep(0.02)
    after = wait_idle(server)  # leaving the block closed the connection mid-stream
    assert after["vllm:kv_cache_usage_perc{}"] == 0
    assert after["vllm:num_requests_running{}"] == 0
    aborted = after.get("vllm:request_success_total{finished_reason=abort}", 0)
    assert aborted - before.get("vllm:request_success_total{finished_reason=abort}", 0) == 1
    generated = after["vllm:generation_tokens_total{}"] - before["vllm:generation_tokens_total{}"]
    assert generated < 480  # stopped early, not run to the end
    # and the server keeps serving
    assert api.completions.create(model=model_name, prompt="ok", max_tokens=2).usage


def test_disconnect_mid_chat_stream_aborts_every_choice(server, model_name):
    # n choices are one request in the engine: hanging up aborts all of them.
    before = wait_idle(server)
    body = {"model": model_name, "messages": MESSAGES, "n": 2, "max_tokens": 480,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server.base_url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()  # kept referenced: dropping it closes the stream
            talking: set[int] = set()
            while talking != {0, 1}:  # both choices are generating
                line = next(lines)
                if line.startswith("data: {"):
                    choice = json.loads(line.removeprefix("data: "))["choices"][0]
                    if choice["delta"].get("content"):
                        talking.add(choice["index"])
    after = wait_idle(server)
    assert after["vllm:kv_cache_usage_perc{}"] == 0 and after["vllm:num_requests_running{}"] == 0
    key = "vllm:request_success_total{finished_reason=abort}"
    assert after.get(key, 0) - before.get(key, 0) == 2
    assert after["vllm:generation_tokens_total{}"] - before["vllm:generation_tokens_total{}"] < 960


def test_disconnect_before_a_plain_response_aborts(server):
    before = wait_idle(server)
    body = {"prompt": PROMPTS[1], "max_tokens": 480, "ignore_eos": True}
    # The client gives up and hangs up long before 480 tokens are done (about 0.4 s for
    # the tiny model on an idle 2-core machine).
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.base_url}/v1/completions", json=body,
                   timeout=httpx.Timeout(10.0, read=0.05))
    after = wait_idle(server)
    key = "vllm:request_success_total{finished_reason=abort}"
    assert after.get(key, 0) - before.get(key, 0) == 1
    assert after["vllm:kv_cache_usage_perc{}"] == 0

