"""A thinking model's reasoning apart from its answer (`--reasoning-parser`), through both
APIs, and chat_template_kwargs reaching the template. The tiny model writes no tags of its own:
with deepseek_r1 (the template opened the block) its whole reply is reasoning, which shows the
split is applied, whole and streamed alike; the split of tagged text is tests/engine/test_reasoning.py's."""

import json

import httpx
import pytest
import transformers

from kvdeck.engine.frontend.reasoning import REASONING_FORMATS, split_reasoning
from tests.model_factory import build_tiny_model
from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(300)

# Qwen3's switch, as its template reads it: enable_thinking false closes an empty block.
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "<|assistant|>\n{% if enable_thinking is defined and enable_thinking is false %}"
            "NOTHINK{% endif %}")
USER = [{"role": "user", "content": "Is 9.11 larger than 9.8?"}]
GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("thinker") / "llama", "llama")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(model)
    live = start_server(model, tmp_path_factory.mktemp("reasoning_logs"), "--reasoning-parser",
                        "deepseek_r1")
    yield live
    stop_server(live)


def chat(server, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                      json={"messages": USER, **GREEDY, **body})


def raw_text(server, prompt_ids: list[int]) -> str:
    """The same greedy reply through /v1/completions, which no reasoning parser reads."""
    reply = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                       json={"prompt": prompt_ids, **GREEDY}).json()
    return reply["choices"][0]["text"]


def test_the_reply_is_split_whole_and_streamed(server):
    whole = chat(server, return_token_ids=True).json()
    message = whole["choices"][0]["message"]
    thought, answer = split_reasoning(REASONING_FORMATS["deepseek_r1"],
                                      raw_text(server, whole["prompt_token_ids"]), True)
    assert thought and message["reasoning"] == message["reasoning_content"] == thought
    assert message["content"] == answer
    lines = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                       json={"messages": USER, **GREEDY, "stream": True}).text.splitlines()
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines
              if line.startswith("data: {")]
    assert "".join(d.get("reasoning", "") for d in deltas) == thought
    assert "".join(d.get("reasoning_content", "") for d in deltas) == thought
    assert "".join(d.get("content", "") for d in deltas) == answer


def test_chat_template_kwargs_reach_the_template(server):
    thinking = chat(server, return_token_ids=True).json()
    plain = chat(server, return_token_ids=True, chat_template_kwargs={"enable_thinking": False}).json()
    decode = lambda ids: httpx.post(f"{server.base_url}/detokenize",  # noqa: E731
                                    json={"tokens": ids}).json()["prompt"]
    assert decode(plain["prompt_token_ids"]).endswith("NOTHINK")
    assert "NOTHINK" not in decode(thinking["prompt_token_ids"])
    counted = httpx.post(f"{server.base_url}/tokenize", json={
        "messages": USER, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert counted["tokens"] == plain["prompt_token_ids"]  # /tokenize counts what chat sends
    refused = httpx.post(f"{server.base_url}/tokenize", json={
        "messages": USER, "chat_template_kwargs": {"tokenize": False}}).json()["error"]
    assert refused["param"] == "chat_template_kwargs"
    for bad, quoted in (({"tokenize": True}, "'tokenize' is set by the engine"),
                        ({"not a name": 1}, "not a template variable name")):
        error = chat(server, chat_template_kwargs=bad).json()["error"]
        assert error["param"] == "chat_template_kwargs" and quoted in error["message"]


def test_a_grammar_held_reply_is_all_answer(server):
    reply = chat(server, response_format={"type": "json_object"}, max_tokens=24).json()
    message = reply["choices"][0]["message"]
    assert "reasoning" not in message and message["content"]


def test_ollama_think(server):
    def ask(**body):
        return httpx.post(f"{server.base_url}/api/chat", timeout=60, json={
            "model": "llama", "messages": USER, "stream": False,
            "options": {"temperature": 0, "num_predict": 12}, **body}).json()

    thinking = ask(think=True)
    assert thinking["message"]["thinking"] and thinking["message"]["content"] == ""
    silent = ask(think=False)  # enable_thinking false, and no parsing: the reply as written
    assert "thinking" not in silent["message"] and silent["message"]["content"]
    assert silent["prompt_eval_count"] > thinking["prompt_eval_count"]  # the template's NOTHINK
    lines = [json.loads(line) for line in httpx.post(
        f"{server.base_url}/api/chat", timeout=60,
        json={"model": "llama", "messages": USER, "think": True,
              "options": {"temperature": 0, "num_predict": 12}}).text.splitlines()]
    assert "".join(line["message"].get("thinking", "") for line in lines) == thinking["message"]["thinking"]
    shown = httpx.post(f"{server.base_url}/api/show", json={"model": "llama"}).json()
    assert shown["capabilities"] == ["completion", "tools", "thinking"]  # clients offer think then
    level = httpx.post(f"{server.base_url}/api/chat", json={"model": "llama", "messages": USER,
                                                            "think": "high"})
    assert level.status_code == 400 and "thinking levels" in level.json()["error"]


def test_the_responses_api_gives_the_reasoning_its_own_item(server):
    body = {"input": USER[0]["content"], "temperature": 0, "max_output_tokens": 12}
    message = chat(server).json()["choices"][0]["message"]  # greedy: the same reply
    reply = httpx.post(f"{server.base_url}/v1/responses", timeout=60, json=body).json()
    reasoning = [item for item in reply["output"] if item["type"] == "reasoning"]
    assert reasoning[0]["content"] == [{"type": "reasoning_text", "text": message["reasoning"]}]
    assert "".join(part["text"] for item in reply["output"] if item["type"] == "message"
                   for part in item["content"]) == message["content"]
    assert 0 < reply["usage"]["output_tokens_details"]["reasoning_tokens"] <= 12
    events = [json.loads(line[6:]) for line in httpx.post(
        f"{server.base_url}/v1/responses", timeout=60, json={**body, "stream": True}).text.splitlines()
        if line.startswith("data: ")]
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert streamed == message["reasoning"]
    assert events[-1]["response"]["output"][0]["content"] == reasoning[0]["content"]


def test_anthropics_api_gives_the_reasoning_a_thinking_block(server):
    body = {"model": "llama", "messages": USER, "temperature": 0, "max_tokens": 12}
    message = chat(server).json()["choices"][0]["message"]  # greedy: the same reply
    reply = httpx.post(f"{server.base_url}/v1/messages", timeout=60, json=body).json()
    assert reply["content"][0] == {"type": "thinking", "thinking": message["reasoning"],
                                   "signature": ""}
    assert "".join(b["text"] for b in reply["content"] if b["type"] == "text") == message["content"]
    events = [json.loads(line[6:]) for line in httpx.post(
        f"{server.base_url}/v1/messages", timeout=60, json={**body, "stream": True}).text.splitlines()
        if line.startswith("data: ")]
    assert events[1]["content_block"]["type"] == "thinking"
    assert "".join(e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "thinking_delta") == message["reasoning"]
    # thinking disabled: the template's switch off (Qwen3's enable_thinking), as on Ollama's think
    off = httpx.post(f"{server.base_url}/v1/messages/count_tokens", json={
        **{k: body[k] for k in ("model", "messages")}, "thinking": {"type": "disabled"}}).json()
    on = httpx.post(f"{server.base_url}/v1/messages/count_tokens", json={
        k: body[k] for k in ("model", "messages")}).json()
    assert off["input_tokens"] > on["input_tokens"]  # the template's NOTHINK
