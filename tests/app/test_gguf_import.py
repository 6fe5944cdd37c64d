"""GGUF import: tiny GGUFs in every supported tensor type become models that kvdeck runs
token for token like transformers running the same GGUF."""

import json
import threading

import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors import safe_open

from kvdeck.app.store import local_models, paths, registry
from kvdeck.app.store.gguf.importer import GGUFImportError, ImportCancelled, import_gguf
from tests.app.gguf_factory import (
    Q,
    build_hf_model,
    hf_gguf_greedy,
    llama3_rope_freqs,
    write_gguf,
    write_header_only_gguf,
)

pytestmark = pytest.mark.timeout(300)

PROMPTS = ["The quick brown fox", "Paged attention stores keys", "def add(a, b):\n    return a + b\n"]
MAX_NEW = 12
# (family, tensor type of the 2-D weights, a few types mixed in as llama.cpp's K-quant presets do)
CASES = {
    "f16": ("llama", Q.F16, None),
    "bf16": ("llama", Q.BF16, None),
    "q8_0": ("llama", Q.Q8_0, None),
    "q4_0": ("llama", Q.Q4_0, {"token_embd.weight": Q.Q8_0}),
    "q4_1": ("llama", Q.Q4_1, None),
    "k-quants": ("llama", Q.Q4_K, {"blk.0.ffn_down.weight": Q.Q5_K, "blk.1.ffn_down.weight": Q.Q5_K,
                                   "output.weight": Q.Q6_K, "blk.1.attn_v.weight": Q.Q6_K}),
    "qwen2-q8_0": ("qwen2", Q.Q8_0, None),
}  # fmt: skip


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-hf")
    return {family: build_hf_model(root / family, family) for family in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def gguf_files(hf_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-files")
    return {case: write_gguf(hf_models[family], root / f"tiny-{case}.gguf", qtype, family=family, types=types)
            for case, (family, qtype, types) in CASES.items()}  # fmt: skip


def _prompt_ids(hf_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    return [tokenizer.encode(p) for p in PROMPTS]


def kvdeck_greedy(model_dir, prompts: list[list[int]], max_new: int, **config) -> list[list[int]]:
    from kvdeck import LLM, SamplingParams

    llm = LLM(str(model_dir), kv_cache_memory_gib=0.01, **config)
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("case", list(CASES))
def test_import_matches_transformers_token_for_token(kvdeck_env, hf_models, gguf_files, case):
    family = CASES[case][0]
    model = import_gguf(gguf_files[case], f"tiny-{case}", dtype="float32")
    assert (model.source, model.architecture, model.dtype, model.verified) == (
        "store", "Qwen2ForCausalLM" if family == "qwen2" else "LlamaForCausalLM", "float32", True)
    prompts = _prompt_ids(hf_models[family])
    expected = hf_gguf_greedy(gguf_files[case], prompts, MAX_NEW)
    assert kvdeck_greedy(model.path, prompts, MAX_NEW) == expected
    assert len({tuple(t) for t in expected}) > 1  # the prompts lead to different continuations


def test_weights_equal_gguf_dequantisation_and_the_original(kvdeck_env, hf_models, gguf_files):
    """K-quant values are gguf's own dequantisation of the file's blocks, q/k rows put back in
    transformers' order; float16 weights round-trip to the original model's."""
    model = import_gguf(gguf_files["k-quants"], "kq", dtype="float32")
    reader = GGUFReader(gguf_files["k-quants"])
    raw = {t.name: dequantize(t.data, t.tensor_type) for t in reader.tensors}
    with safe_open(str(model.path / "model.safetensors"), framework="pt") as f:
        down = f.get_tensor("model.layers.0.mlp.down_proj.weight")
        assert torch.equal(down, torch.from_numpy(raw["blk.0.ffn_down.weight"]))
        assert torch.equal(f.get_tensor("lm_head.weight"), torch.from_numpy(raw["output.weight"]))
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert not torch.equal(q, torch.from_numpy(raw["blk.0.attn_q.weight"]))  # permuted back
    assert sorted(q.flatten().tolist()) == sorted(raw["blk.0.attn_q.weight"].flatten().tolist())

    f16 = import_gguf(gguf_files["f16"], "f16", dtype="float32")
    with safe_open(str(f16.path / "model.safetensors"), framework="pt") as f, \
            safe_open(str(hf_models["llama"] / "model.safetensors"), framework="pt") as original:  # fmt: skip
        for name in ("model.layers.1.self_attn.k_proj.weight", "model.embed_tokens.weight"):
            assert torch.equal(f.get_tensor(name), original.get_tensor(name).half().float()), name


def test_default_bfloat16_is_the_float32_import_rounded(kvdeck_env, gguf_files, hf_models):
    fp32 = import_gguf(gguf_files["q4_1"], "fp32", dtype="float32")
    bf16 = import_gguf(gguf_files["q4_1"], "bf16")
    assert bf16.dtype == "bfloat16"
    assert json.loads((bf16.path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(fp32.path / "model.safetensors"), framework="pt") as a, \
            safe_open(str(bf16.path / "model.safetensors"), framework="pt") as b:  # fmt: skip
        assert set(a.keys()) == set(b.keys())
        for name in a.keys():  # noqa: SIM118 - safe_open is not a dict
            assert torch.equal(b.get_tensor(name), a.get_tensor(name).to(torch.bfloat16)), name
    assert bf16.size_bytes < fp32.size_bytes * 0.6


def test_row_slices_and_shards_give_the_same_model(kvdeck_env, gguf_files, hf_models, monkeypatch):
    """Big tensors are dequantised a slice of rows at a time and big models written in shards;
    shrunk to tiny sizes here, the result must be the same model."""
    whole = import_gguf(gguf_files["k-quants"], "whole", dtype="float32")
    monkeypatch.setattr("kvdeck.app.store.gguf.tensors.CHUNK_BYTES", 4096)  # 4 rows of 256 floats per slice
    monkeypatch.setattr("kvdeck.app.store.safetensors_stream.DEFAULT_SHARD_BYTES", 1024**2)
    sliced = import_gguf(gguf_files["k-quants"], "sliced", dtype="float32")
    shards = sorted(p.name for p in sliced.path.glob("*.safetensors"))
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    weight_map = json.loads((sliced.path / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(whole.path / "model.safetensors"), framework="pt") as reference:
        assert set(weight_map) == set(reference.keys())
        for name, shard in weight_map.items():
            with safe_open(str(sliced.path / shard), framework="pt") as f:
                assert torch.equal(f.get_tensor(name), reference.get_tensor(name)), name
    prompts = _prompt_ids(hf_models["llama"])
    assert kvdeck_greedy(sliced.path, prompts, 4) == kvdeck_greedy(whole.path, prompts, 4)


def test_tokenizer_chat_template_and_registry_record(kvdeck_env, gguf_files, hf_models, tmp_path):
    from transformers import AutoTokenizer

    model = import_gguf(gguf_files["q8_0"], "tok")
    original = AutoTokenizer.from_pretrained(hf_models["llama"])
    imported = AutoTokenizer.from_pretrained(model.path)
    text = "Héllo wörld, ça va? 日本語 🙂 <|user|> def add(a, b):\n    return a + b"
    assert imported.encode(text) == original.encode(text)
    messages = [{"role": "user", "content": "Hi there"}]
    assert imported.apply_chat_template(messages, add_generation_prompt=True) == \
        original.apply_chat_template(messages, add_generation_prompt=True)  # fmt: skip
    assert (imported.eos_token, imported.bos_token) == (original.eos_token, original.bos_token)
    assert imported.encode("Hi")[0] != imported.bos_token_id
    # A file that asks for a BOS token (tokenizer.ggml.add_bos_token) gets a tokenizer that adds it.
    with_bos = write_gguf(hf_models["llama"], tmp_path / "bos.gguf", Q.Q8_0, add_bos=True)
    bos_tokenizer = AutoTokenizer.from_pretrained(import_gguf(with_bos, "bos").path)
    assert bos_tokenizer.encode("Hi") == [original.bos_token_id] + original.encode("Hi")
    record = registry.read()["verified"][registry.store_key("tok")]
    assert record["gguf_file"] == str(gguf_files["q8_0"]) and record["gguf_quantization"] == "Q8_0"
    assert record["origin"] == str(gguf_files["q8_0"]) and record["gguf_tensor_types"] == ["F32", "Q8_0"]
    assert local_models.find_model("tok").origin == str(gguf_files["q8_0"])


def test_llama3_rope_factors_become_rope_parameters(kvdeck_env, tmp_path):
    """llama.cpp stores Llama 3 rope scaling as a rope_freqs tensor; the import must rebuild it
    (transformers' GGUF loader ignores it), so the reference here is the original model."""
    from tests.model_factory import hf_greedy

    rope = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    hf_dir = build_hf_model(tmp_path / "hf", "llama", rope_parameters=rope, hidden_size=512,
                            num_attention_heads=4, intermediate_size=512)  # fmt: skip
    config = json.loads((hf_dir / "config.json").read_text())
    gguf = write_gguf(hf_dir, tmp_path / "l3.gguf", Q.F32, rope_freqs=llama3_rope_freqs(config))
    model = import_gguf(gguf, "l3", dtype="float32")
    got = json.loads((model.path / "config.json").read_text())["rope_parameters"]
    assert got == pytest.approx(rope)
    prompts = _prompt_ids(hf_dir)
    assert kvdeck_greedy(model.path, prompts, MAX_NEW) == hf_greedy(hf_dir, prompts, MAX_NEW)


def test_qwen3_head_dim_from_key_length(kvdeck_env, tmp_path):
    """Qwen3's head size is not hidden/heads; llama.cpp states it as attention.key_length, which
    transformers' GGUF config leaves out, so the reference is the original model."""
    from tests.model_factory import hf_greedy

    hf_dir = build_hf_model(tmp_path / "hf", "qwen3", head_dim=32, tie_word_embeddings=True)
    gguf = write_gguf(hf_dir, tmp_path / "q3.gguf", Q.F32, family="qwen3")
    model = import_gguf(gguf, "q3", dtype="float32")
    config = json.loads((model.path / "config.json").read_text())
    assert (config["architectures"], config["head_dim"], config["tie_word_embeddings"]) == (
        ["Qwen3ForCausalLM"], 32, True)
    prompts = _prompt_ids(hf_dir)
    assert kvdeck_greedy(model.path, prompts, MAX_NEW) == hf_greedy(hf_dir, prompts, MAX_NEW)


def test_import_bar_draws_on_a_terminal(monkeypatch):
    import io

    from kvdeck.app.cli.gguf import ImportBar
    from kvdeck.app.store.gguf.importer import ImportProgress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "100")
    out = Tty()
    bar = ImportBar(out)
    bar(ImportProgress("reading"))
    bar(ImportProgress("tensors", 5, 20, 25 * 1024**2, 100 * 1024**2, "blk.1.ffn_up.weight"))
    text = out.getvalue()
    assert "reading the GGUF header" in text and "dequantising tensors" in text
    assert "[" + "#" * 10 + "." * 30 + "]" in text
    assert " 25% 5/20 tensors 26.2 MB/104.9 MB blk.1.ffn_up.weight" in text


def test_bad_files_get_clear_errors_and_leave_nothing(kvdeck_env, gguf_files, hf_models, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("just some text, long enough to be read\n" * 10)
    with pytest.raises(GGUFImportError, match="not a GGUF file"):
        import_gguf(text, "a")
    with pytest.raises(GGUFImportError, match="no such file"):
        import_gguf(tmp_path / "missing.gguf", "a")

    data = gguf_files["q4_0"].read_bytes()
    for cut in (len(data) // 2, 200):  # tensor data cut off; header cut off
        truncated = tmp_path / f"cut-{cut}.gguf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(GGUFImportError, match="truncated"):
            import_gguf(truncated, "a")

    q81 = write_gguf(hf_models["llama"], tmp_path / "q81.gguf", Q.Q8_0, types={"blk.0.attn_v.weight": Q.Q8_1})
    with pytest.raises(GGUFImportError, match="Q8_1"):
        import_gguf(q81, "a")

    with pytest.raises(GGUFImportError, match="architecture 'gpt2' is not supported"):
        import_gguf(write_header_only_gguf(tmp_path / "gpt2.gguf", "gpt2"), "a")

    import_gguf(gguf_files["q4_0"], "taken")
    with pytest.raises(GGUFImportError, match="'taken' is already taken"):
        import_gguf(gguf_files["q4_1"], "taken")
    with pytest.raises(GGUFImportError, match="model name"):
        import_gguf(gguf_files["q4_1"], "../escape")
    with pytest.raises(GGUFImportError, match="dtype"):
        import_gguf(gguf_files["q4_1"], "b", dtype="int8")
    assert [m.name for m in local_models.list_models()] == ["taken"]
    assert list(paths.staging_dir().iterdir()) == []

    # A staging folder whose process was killed outright goes at the next import.
    orphan = paths.staging_dir() / "import-orphan"
    (orphan / "model").mkdir(parents=True)
    (orphan / "owner.pid").write_text("999999999")
    import_gguf(gguf_files["q4_1"], "after-crash")
    assert list(paths.staging_dir().iterdir()) == []


def test_cancel_and_interrupt_leave_nothing(kvdeck_env, gguf_files, monkeypatch, capsys):
    monkeypatch.setattr("kvdeck.app.store.gguf.importer.REPORT_INTERVAL_S", 0.0)  # report every tensor
    cancel = threading.Event()
    seen = []

    def on_progress(p):
        seen.append((p.phase, p.tensors_done, p.tensors_total, p.bytes_done))
        if p.phase == "tensors" and p.tensors_done == 3:
            cancel.set()

    with pytest.raises(ImportCancelled):
        import_gguf(gguf_files["q8_0"], "c", on_progress=on_progress, cancel=cancel)
    assert ("reading", 0, 0, 0) in seen and any(s[0] == "tensors" and s[1] == 3 for s in seen)
    assert local_models.list_models() == [] and list(paths.staging_dir().iterdir()) == []
    assert not (paths.store_dir() / "c").exists()

    # Ctrl-C in the middle of the tensors, through the CLI.
    from kvdeck.app.cli import main
    from kvdeck.app.store.gguf import tensors as gguf_tensors

    real = gguf_tensors.dequantised_rows
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_tensors, "dequantised_rows", interrupted)
    assert main(["import", str(gguf_files["q8_0"]), "--name", "c"]) == 130
    assert "nothing was kept" in capsys.readouterr().err
    assert local_models.list_models() == [] and list(paths.staging_dir().iterdir()) == []
    assert main(["import", str(gguf_files["q8_0"]), "--name", "c"]) == 0  # the same command, uninterrupted
    out = capsys.readouterr().out
    assert "dequantising tensors" in out and "imported c (LlamaForCausalLM" in out
    assert [m.name for m in local_models.list_models()] == ["c"]
