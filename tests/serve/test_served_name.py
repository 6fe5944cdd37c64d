"""The server's model name: short by default (the store's name, or the folder's), overridden
by --served-model-name, and requests may also name the model by its path or as --model gave it."""

import shutil
import time

import openai
import pytest
from fastapi.testclient import TestClient

from kvdeck.app.cli.default_model import default_model
from kvdeck.app.serve.served_name import served_names
from kvdeck.app.serve.server import create_app
from kvdeck.app.store import local_models
from kvdeck.assets import demo_model_dir
from kvdeck.engine.api.async_llm import AsyncLLM
from tests.serve.conftest import KV_GIB

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def store_home(tmp_path, monkeypatch):
    """An empty model store, so the user's own models play no part."""
    monkeypatch.setenv("KVDECK_HOME", str(tmp_path / "kvdeck-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path


def test_an_unlisted_folder_is_served_by_its_folder_name(store_home, serve_model_dir):
    folder = store_home / "SmolLM2-135M-Instruct"
    shutil.copytree(serve_model_dir, folder)
    names = served_names(str(folder))
    assert names.name == "SmolLM2-135M-Instruct"
    assert str(folder) in names and "SmolLM2-135M-Instruct" in names
    assert "llama" not in names and "gpt-4" not in names


def test_a_listed_model_is_served_by_its_store_name(store_home, serve_model_dir):
    local_models.add_folder(serve_model_dir, "tiny-chat")
    path = default_model("tiny-chat")  # `--model tiny-chat` opens the store's folder
    assert path == str(serve_model_dir.resolve())
    names = served_names(path, aliases=("tiny-chat",))
    assert names.name == "tiny-chat" and names.aliases == {path}


def test_the_demo_model_is_served_as_the_store_calls_it(store_home):
    for model in ("kvdeck-demo", str(demo_model_dir())):  # AsyncLLM(None) / its folder
        names = served_names(model, aliases=("demo",))
        assert names.name == "kvdeck-demo"
        assert str(demo_model_dir().resolve()) in names and "demo" in names


def test_served_model_name_overrides_and_the_default_stays_an_alias(store_home, serve_model_dir):
    names = served_names(str(serve_model_dir), override="my-model")
    assert names.name == "my-model"
    assert names.aliases == {str(serve_model_dir), "llama"}


def test_a_hub_id_not_on_disk_keeps_its_id(store_home):
    names = served_names("Org/Some-Model-1B")
    assert names.name == "Org/Some-Model-1B" and names.aliases == frozenset()


def test_a_live_server_answers_to_its_name_and_aliases(store_home, serve_model_dir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # read by the spawned engine process
    local_models.add_folder(serve_model_dir, "tiny-chat")
    path = default_model("tiny-chat")
    client = AsyncLLM(path, kv_cache_memory_gib=float(KV_GIB))
    app = create_app(client, model_aliases=("tiny-chat",), engine_restart_delay=None)
    with TestClient(app) as http:  # the lifespan starts the engine
        api = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http,
                            max_retries=0)
        _wait_ready(http)
        assert [m.id for m in api.models.list().data] == ["tiny-chat"]
        for name in ("tiny-chat", path):
            out = api.completions.create(model=name, prompt="hello", max_tokens=2)
            assert out.model == "tiny-chat" and out.usage.completion_tokens == 2
        chat = api.chat.completions.create(model=path, max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
        assert chat.model == "tiny-chat"
        with pytest.raises(openai.NotFoundError) as missing:
            api.completions.create(model="llama-7b", prompt="hello", max_tokens=2)
        assert "'tiny-chat'" in str(missing.value)
        schema = http.get("/openapi.json").json()["components"]["schemas"]
        assert schema["CompletionRequest"]["properties"]["model"]["anyOf"][0]["enum"] == [
            "tiny-chat", path]


def _wait_ready(http: TestClient, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while http.get("/health").status_code != 200:
        assert time.monotonic() < deadline, http.get("/health").json()
        time.sleep(0.2)
