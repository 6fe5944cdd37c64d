"""LoRA serving without an engine: the flags (`--lora-modules NAME=DIR` or vLLM's JSON), the
start-up checks of every adapter (a bad one is a CLI error naming it and the problem), the
name registry, and the runtime routes' refusals (they check before the engine is asked)."""

import json

import pytest
from fastapi.testclient import TestClient

from kvdeck.app.cli import build_parser, main
from kvdeck.app.serve.lora_adapters import LoRAModule, registry_from_modules
from kvdeck.app.serve.server import create_app
from kvdeck.engine.api.async_llm import AsyncLLM
from kvdeck.engine.types.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvdeck.engine.types.sampling_params import SamplingParams


def _adapter(folder, rank=8, **config):
    folder.mkdir(parents=True)
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
            "base_model_name_or_path": "tiny", **config}
    (folder / "adapter_config.json").write_text(json.dumps(body))
    (folder / "adapter_model.safetensors").write_bytes(b"weights are read by the engine")
    return folder


def test_lora_modules_take_name_eq_dir_and_vllms_json():
    args = build_parser([]).parse_args([
        "--serve", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
        "--lora-modules", "sql=/a/sql", '{"name": "code", "path": "/a/code", "base_model_name": "m"}',
        "--allow-runtime-lora"])
    assert args.lora_modules == [LoRAModule("sql", "/a/sql"), LoRAModule("code", "/a/code", "m")]
    assert args.enable_lora and args.max_loras == 2 and args.max_lora_rank == 16
    assert args.allow_runtime_lora


@pytest.mark.parametrize("value, message", [
    ("sql", "expected NAME=DIR"),
    ("=dir", "expected NAME=DIR"),
    ('{"name": "x"}', 'needs string fields "name" and "path"'),
    ('{"name": "x", "path": "/p", "rank": 4}', "unknown field(s) rank"),
    ("{nope", "not valid JSON"),
])
def test_a_malformed_lora_module_is_named(value, message, capsys):
    with pytest.raises(SystemExit):
        build_parser([]).parse_args(["--serve", "--enable-lora", "--lora-modules", value])
    assert message in capsys.readouterr().err


def test_lora_modules_need_serve(capsys):
    with pytest.raises(SystemExit):
        main(["--lora-modules", "a=/x"])
    assert "--lora-modules only applies with --serve" in capsys.readouterr().err


@pytest.mark.parametrize("make, flags, message", [
    (lambda d: _adapter(d / "a"), ["--lora-modules", "a={dir}/a"],
     "--lora-modules needs --enable-lora"),
    (lambda d: None, ["--enable-lora", "--lora-modules", "a={dir}/missing"],
     "--lora-modules a={dir}/missing: LoRA adapter folder '{dir}/missing' does not exist"),
    (lambda d: _adapter(d / "a", rank=32), ["--enable-lora", "--max-lora-rank", "16",
                                            "--lora-modules", "a={dir}/a"],
     "rank 32, above max_lora_rank 16"),
    (lambda d: _adapter(d / "a", target_modules=["lm_head"]),
     ["--enable-lora", "--lora-modules", "a={dir}/a"], "unknown target module(s) lm_head"),
    (lambda d: _adapter(d / "a"), ["--enable-lora", "--lora-modules", "llama={dir}/a"],
     "the name 'llama' is the base model's"),
    (lambda d: _adapter(d / "a"), ["--enable-lora", "--lora-modules", "x={dir}/a", "x={dir}/a"],
     "The lora adapter 'x' has already been loaded."),
    (lambda d: None, ["--allow-runtime-lora"], "--allow-runtime-lora needs --enable-lora"),
])
def test_a_bad_adapter_stops_the_server_before_it_serves(serve_model_dir, tmp_path, capsys,
                                                          make, flags, message):
    make(tmp_path)
    flags = [f.format(dir=tmp_path) for f in flags]
    code = main(["--serve", "--model", str(serve_model_dir), "--port", "1", *flags])
    assert code == 2
    assert message.format(dir=tmp_path) in capsys.readouterr().err


def _app(model_dir, tmp_path, allow_runtime=True, **engine):
    client = AsyncLLM(str(model_dir), enable_lora=True, **engine)
    modules = (LoRAModule("sql", str(_adapter(tmp_path / "sql"))),)
    app = create_app(client, lora_modules=modules, allow_runtime_lora=allow_runtime,
                     engine_restart_delay=None)
    return app, client


def test_models_lists_adapters_with_their_parent(serve_model_dir, tmp_path):
    app, _ = _app(serve_model_dir, tmp_path)
    http = TestClient(app)  # no lifespan: no engine is started
    cards = http.get("/v1/models").json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [("llama", None), ("sql", "llama")]
    assert cards[1]["root"] == str(tmp_path / "sql")


def test_runtime_routes_refuse_unless_allowed(serve_model_dir, tmp_path):
    app, _ = _app(serve_model_dir, tmp_path, allow_runtime=False)
    http = TestClient(app)
    for route, body in (("load", {"lora_name": "b", "lora_path": str(tmp_path / "sql")}),
                        ("unload", {"lora_name": "sql"})):
        reply = http.post(f"/v1/{route}_lora_adapter", json=body)
        assert reply.status_code == 404
        assert "--allow-runtime-lora" in reply.json()["error"]["message"]


def test_runtime_routes_check_before_the_engine(serve_model_dir, tmp_path):
    app, _ = _app(serve_model_dir, tmp_path)
    http = TestClient(app)
    _adapter(tmp_path / "big", rank=128)
    for body, status, text in (
        ({"lora_name": "sql", "lora_path": str(tmp_path / "sql")}, 400,
         "The lora adapter 'sql' has already been loaded."),
        ({"lora_name": "llama", "lora_path": str(tmp_path / "sql")}, 400, "is the base model's"),
        ({"lora_name": "llama:latest", "lora_path": str(tmp_path / "sql")}, 400, "is the base model's"),
        ({"lora_name": "b", "lora_path": str(tmp_path / "nowhere")}, 400, "does not exist"),
        ({"lora_name": "b", "lora_path": str(tmp_path / "big")}, 400, "above max_lora_rank 64"),
        ({"lora_name": "b", "lora_path": "x" * 5000}, 400, "File name too long"),
        ({"lora_name": "", "lora_path": "x"}, 400, "Both 'lora_name' and 'lora_path'"),
        ({"lora_name": "b"}, 400, "lora_path: field required"),
        ({"lora_name": "b", "lora_path": str(tmp_path / "sql")}, 503, "the engine is"),
    ):
        reply = http.post("/v1/load_lora_adapter", json=body)
        assert reply.status_code == status, reply.text
        assert text in reply.json()["error"]["message"]
    reply = http.post("/v1/unload_lora_adapter", json={"lora_name": "nope"})
    assert reply.status_code == 404
    assert reply.json()["error"]["message"] == "The lora adapter 'nope' cannot be found."
    # A request naming an unknown model keeps its 404; the message lists the adapters.
    reply = http.post("/v1/completions", json={"model": "nope", "prompt": "hi"})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"
    assert "the LoRA adapters 'sql'" in reply.json()["error"]["message"]


def _finished(request_id: str) -> RequestOutput:
    return RequestOutput(request_id, None, [1], [CompletionOutput(0, "", [2], "stop")], True,
                         RequestMetrics(arrival_time=0.0))


def test_an_unloaded_adapter_leaves_the_engine_when_its_last_request_ends(tmp_path):
    registry = registry_from_modules([LoRAModule("a", str(_adapter(tmp_path / "a")))],
                                     base_name="base", reserved=frozenset(), enabled=True,
                                     max_lora_rank=64)
    lora = registry.get("a")
    assert registry.track("r1", SamplingParams(n=2), lora) == ["r1-0", "r1-1"]
    assert registry.lora_name_of("r1-1") == "a"
    removed, idle = registry.remove("a")
    assert removed == lora and not idle and registry.get("a") is None
    assert registry.observe_output(_finished("r1-0")) == []
    assert registry.observe_output(_finished("r1-1")) == [lora.lora_int_id]
    # Loaded again under the same name, it is a new adapter to the engine.
    again = registry.new_request("a", registry.check_new("a", str(tmp_path / "a")))
    assert again.lora_int_id != lora.lora_int_id


def test_lora_requests_info_names_running_and_waiting_adapters():
    from kvdeck.app.serve.metrics import lora_requests_info
    from kvdeck.engine.types.stats import RequestStats
    from tests.tui.demo_stats import demo_stats

    stats = demo_stats()
    stats.requests = [RequestStats("a", "decoding", 4, 4, 1, [1], 0, lora_name="sql"),
                      RequestStats("b", "prefilling", 4, 2, 0, [2], 0, lora_name="code"),
                      RequestStats("c", "waiting", 4, 0, 0, [], 0, lora_name="chat"),
                      RequestStats("d", "preempted", 4, 0, 0, [], 0, lora_name="sql"),
                      RequestStats("e", "decoding", 4, 4, 1, [3], 0)]
    (sample,) = lora_requests_info(stats, 4).samples
    assert sample.labels == {"running_lora_adapters": "code,sql", "waiting_lora_adapters": "chat,sql",
                             "max_lora": "4"}
    assert sample.value == stats.timestamp
    (idle,) = lora_requests_info(None, 2).samples
    assert idle.labels["running_lora_adapters"] == "" and idle.labels["max_lora"] == "2"
