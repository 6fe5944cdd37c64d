"""/v1/embeddings through the official `openai` client (which asks for base64) and as plain
JSON, and Ollama's /api/embed and /api/embeddings through the `ollama` client, against a live
server: each vector equals transformers' last hidden state at the input's last token,
normalised; the errors name their field; a long input is refused or, for Ollama's truncate,
cut; nothing is left queued."""

import httpx
import ollama
import openai
import pytest
import torch
import transformers

from tests.serve.conftest import start_server, stop_server
from tests.serve.test_openai_api import wait_idle

pytestmark = pytest.mark.timeout(300)

TEXTS = ["The capital of France is Paris.", "A cat sat on the mat and looked at the door."]
MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def server(serve_model_dir, tmp_path_factory):
    live = start_server(serve_model_dir, tmp_path_factory.mktemp("embed_logs"), "--max-model-len",
                        str(MAX_MODEL_LEN), "--dtype", "float32")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def reference(serve_model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(serve_model_dir)
    model = transformers.AutoModel.from_pretrained(serve_model_dir, dtype=torch.float32).eval()

    def embed(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
        return torch.nn.functional.normalize(hidden, dim=-1)

    return tokenizer, embed, model.config.hidden_size


@pytest.fixture(scope="module")
def name(server) -> str:
    return httpx.get(f"{server.base_url}/v1/models").json()["data"][0]["id"]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120)


def assert_close(got: list[float], want: torch.Tensor) -> None:
    assert len(got) == want.shape[0]
    assert torch.allclose(torch.tensor(got), want, atol=1e-4), (torch.tensor(got) - want).abs().max()


def test_openai_client_base64_and_float_equal_transformers(server, reference, name):
    tokenizer, embed, hidden_size = reference
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
    reply = client.embeddings.create(model=name, input=TEXTS)  # base64 on the wire
    assert [d.index for d in reply.data] == [0, 1] and reply.model == name
    ids = [tokenizer(text).input_ids for text in TEXTS]
    for data, prompt in zip(reply.data, ids, strict=True):
        assert_close(data.embedding, embed(prompt))
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(len, ids))
    plain = post(server, "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "float",
                                            "dimensions": hidden_size}).json()
    assert plain["object"] == "list" and plain["data"][0]["object"] == "embedding"
    assert plain["data"][0]["embedding"] == pytest.approx(reply.data[0].embedding, abs=1e-6)
    tokens = post(server, "/v1/embeddings", {"input": [ids[1], [5, 6, 7]]}).json()
    assert_close(tokens["data"][0]["embedding"], embed(ids[1]))
    assert_close(tokens["data"][1]["embedding"], embed([5, 6, 7]))


@pytest.mark.parametrize("body, status, param, words", [
    ({"input": "x " * 200}, 400, "input", "maximum context length"),
    ({"input": "hi", "dimensions": 3}, 400, "dimensions", "embedding size"),
    ({"input": [[1, 10**9]]}, 400, "input", ""),
    ({"input": ""}, 400, "input", ""),
    ({"input": []}, 400, "input", ""),
    ({"input": "hi", "model": "nope"}, 404, "model", "nope"),
    ({"input": "hi", "encoding_format": "hex"}, 400, "encoding_format", ""),
])
def test_openai_errors_name_their_field(server, body, status, param, words):
    reply = post(server, "/v1/embeddings", body)
    error = reply.json()["error"]
    assert reply.status_code == status and error["param"] == param, error
    assert words in error["message"]


def test_ollama_embed_and_legacy_embeddings(server, reference, name):
    tokenizer, embed, _ = reference
    client = ollama.Client(host=server.base_url, timeout=120)
    reply = client.embed(model=name, input=TEXTS)
    assert len(reply.embeddings) == 2 and reply.prompt_eval_count > 0
    for vector, text in zip(reply.embeddings, TEXTS, strict=True):
        assert_close(vector, embed(tokenizer(text).input_ids))
    legacy = client.embeddings(model=name, prompt=TEXTS[1])
    assert legacy.embedding == pytest.approx(reply.embeddings[1], abs=1e-6)
    assert client.embed(model=name, input=[]).embeddings == []  # Ollama's "load the model" call
    # truncate (Ollama's default) keeps the first tokens that fit; false refuses.
    long = "y " * 200
    cut = client.embed(model=name, input=long).embeddings[0]
    assert_close(cut, embed(tokenizer(long).input_ids[:MAX_MODEL_LEN - 1]))
    refused = post(server, "/api/embed", {"model": name, "input": long, "truncate": False})
    assert refused.status_code == 400 and "maximum context length" in refused.json()["error"]
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model="nope", input="hi")
    assert caught.value.status_code == 404
    wait_idle(server)
