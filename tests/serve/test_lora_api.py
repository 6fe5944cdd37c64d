"""LoRA adapters served by a live `kvdeck --serve`: a request's `model` picks the adapter (its
output is the offline LLM's under the same LoRARequest), /v1/models lists adapters under
their base, adapters load and unload through vLLM's routes while another request streams,
and /metrics carries vllm:lora_requests_info."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.lora import LoRARequest
from tests.lora_factory import build_adapter
from tests.serve.conftest import KV_GIB, start_server, stop_server

pytestmark = pytest.mark.timeout(180)

PROMPT = [5, 17, 42, 9, 33, 71, 12]  # token ids: no tokeniser in the way
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def adapters(serve_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_adapters")
    return {name: build_adapter(serve_model_dir, root / name, seed=seed)
            for name, seed in (("sql", 1), ("code", 2))}


@pytest.fixture(scope="module")
def served(serve_model_dir, adapters, tmp_path_factory):
    """The live server, and the offline LLM's greedy tokens for the base and each adapter
    (computed while the server starts)."""
    with ThreadPoolExecutor(1) as pool:
        booting = pool.submit(start_server, serve_model_dir, tmp_path_factory.mktemp("lora_logs"),
                              "--enable-lora", "--max-loras", "2",
                              "--lora-modules", f"sql={adapters['sql']}", "--allow-runtime-lora")
        try:
            expected = _offline_tokens(serve_model_dir, adapters)
        finally:
            live = booting.result()
    yield live, expected
    stop_server(live)


@pytest.fixture(scope="module")
def server(served):
    return served[0]


@pytest.fixture(scope="module")
def expected(served) -> dict[str | None, list[int]]:
    return served[1]


def _offline_tokens(model_dir, adapters) -> dict[str | None, list[int]]:
    loras = [None, LoRARequest("sql", 1, str(adapters["sql"])),
             LoRARequest("code", 2, str(adapters["code"]))]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(str(model_dir), enable_lora=True, max_loras=2,
             kv_cache_memory_gib=float(KV_GIB)) as llm:
        outs = llm.generate([PROMPT] * 3, params, lora_request=loras)
    return {(lora.lora_name if lora else None): out.outputs[0].token_ids
            for lora, out in zip(loras, outs, strict=True)}


def _complete(server, model: str, **extra) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True, **extra})


def _tokens(reply: httpx.Response) -> list[int]:
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["token_ids"]


def test_model_picks_the_adapter(server, serve_model_dir, adapters, expected):
    assert expected["sql"] != expected[None] and expected["code"] != expected["sql"]  # they bite
    base = serve_model_dir.name
    assert _tokens(_complete(server, base)) == expected[None]
    reply = _complete(server, "sql")
    assert _tokens(reply) == expected["sql"] and reply.json()["model"] == "sql"
    cards = httpx.get(f"{server.base_url}/v1/models").json()["data"]
    assert [(c["id"], c["parent"], c["root"]) for c in cards] == [
        (base, None, str(serve_model_dir)), ("sql", base, str(adapters["sql"]))]
    assert httpx.get(f"{server.base_url}/v1/models/sql").json() == cards[1]
    # Ollama's routes pick it too, with or without the tag; /api/tags lists it under its base.
    ollama = httpx.post(f"{server.base_url}/api/generate", timeout=60, json={
        "model": "sql:latest", "prompt": "hi", "raw": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 4}}).json()
    openai_text = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "model": "sql", "prompt": "hi", "max_tokens": 4, "temperature": 0}).json()
    assert ollama["response"] == openai_text["choices"][0]["text"]
    # The Responses API too: the chat route's reply under the adapter, named by it.
    messages = [{"role": "user", "content": "hi"}]
    chat = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": "sql", "messages": messages, "max_tokens": 4, "temperature": 0}).json()
    response = httpx.post(f"{server.base_url}/v1/responses", timeout=60, json={
        "model": "sql", "input": messages, "max_output_tokens": 4, "temperature": 0}).json()
    assert response["model"] == "sql"
    assert response["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    tags = {m["name"]: m["details"]["parent_model"]
            for m in httpx.get(f"{server.base_url}/api/tags").json()["models"]}
    assert tags == {f"{base}:latest": "", "sql:latest": f"{base}:latest"}
    assert _complete(server, "code").status_code == 404  # not loaded yet


def test_load_and_unload_while_another_request_streams(server, adapters, expected):
    url = server.base_url
    body = {"model": "sql", "prompt": PROMPT, "max_tokens": 400, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["model"] == "sql"
        loaded = httpx.post(f"{url}/v1/load_lora_adapter",
                            json={"lora_name": "code", "lora_path": str(adapters["code"])})
        assert loaded.status_code == 200
        assert loaded.text == "Success: LoRA adapter 'code' added successfully."
        again = httpx.post(f"{url}/v1/load_lora_adapter",
                           json={"lora_name": "code", "lora_path": str(adapters["code"])})
        assert again.status_code == 400
        assert again.json()["error"]["message"] == "The lora adapter 'code' has already been loaded."
        assert _tokens(_complete(server, "code")) == expected["code"]
        # Unloading the adapter this stream runs under: the name goes, the stream goes on.
        unloaded = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert unloaded.status_code == 200
        assert unloaded.text == "Success: LoRA adapter 'sql' removed successfully."
        assert _complete(server, "sql").status_code == 404
        events = [json.loads(line[6:]) for line in lines
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(e["choices"][0]["text"]) > 0 for e in events) > 1
    # It was still running when its adapter was unloaded (so it finished under it).
    assert "unloaded LoRA adapter 'sql' (its running requests finish under it)" in server.log()
    ids = [c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]]
    assert ids[1:] == ["code"]
    # Loaded again, under the same name: served again (a new adapter id to the engine).
    assert httpx.post(f"{url}/v1/load_lora_adapter", json={
        "lora_name": "sql", "lora_path": str(adapters["sql"])}).status_code == 200
    assert _tokens(_complete(server, "sql")) == expected["sql"]


def test_metrics_carry_lora_requests_info(server):
    text = httpx.get(f"{server.base_url}/metrics").text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"]
    (sample,) = family.samples
    assert set(sample.labels) == {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}
    assert sample.labels["max_lora"] == "2" and sample.value > 1.7e9  # a wall-clock time
