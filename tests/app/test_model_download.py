"""Downloads through the real huggingface_hub client against a loopback hub."""

import hashlib

import pytest

from kvdeck.app.store import local_models, paths, registry
from kvdeck.app.store.download import (
    CancelToken,
    CorruptFile,
    DownloadCancelled,
    GatedRepo,
    NetworkError,
    RepoNotFound,
    UnsupportedArchitecture,
    download_model,
)
from kvdeck.app.store.download_progress import DownloadProgress

pytestmark = pytest.mark.timeout(120)

WEIGHT = "model-00002-of-00003.safetensors"


def _names() -> list[str]:
    return [m.name for m in local_models.list_models()]


def _record(progress: list[DownloadProgress]):
    return progress.append


def test_complete_download_is_verified_and_listed(hub, hub_model_dir):
    progress: list[DownloadProgress] = []
    model = download_model("tiny/llama", on_progress=_record(progress))

    assert model.name == "tiny/llama" and model.source == "hf-cache" and model.verified
    assert model.architecture == "LlamaForCausalLM" and model.supported
    assert model.dtype == "float16" and model.quantization is None
    assert model.commit == hub.repos["tiny/llama"].commit
    expected = sum(p.stat().st_size for p in hub_model_dir.iterdir())
    assert model.size_bytes == expected
    # Every file is byte-identical to the source, in the hub cache layout under HF_HOME.
    snapshot = paths.hf_home() / "hub" / "models--tiny--llama" / "snapshots" / model.commit
    assert model.path == snapshot
    for src in hub_model_dir.iterdir():
        assert (snapshot / src.name).is_symlink()
        assert (snapshot / src.name).read_bytes() == src.read_bytes()
    # Parameter count from the safetensors headers equals the real model's.
    from safetensors import safe_open

    real = 0
    for shard in hub_model_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            real += sum(f.get_slice(k).get_shape().numel() if hasattr(f.get_slice(k).get_shape(), "numel")
                        else _prod(f.get_slice(k).get_shape()) for k in f.keys())  # fmt: skip
    assert model.num_params == real
    # Progress: totals right, done bytes monotone, ends complete.
    assert progress[-1].phase == "done"
    assert progress[-1].total_bytes == expected == progress[-1].done_bytes
    done = [p.done_bytes for p in progress]
    assert done == sorted(done)
    assert all(f.state == "done" and f.done == f.size for f in progress[-1].files)
    assert _names() == ["tiny/llama"]
    assert local_models.pending_downloads() == []


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_connection_dropped_mid_file_resumes_with_range(hub):
    size = len(hub.repos["tiny/llama"].files[WEIGHT])
    hub.drop_once[("tiny/llama", WEIGHT)] = size // 2
    model = download_model("tiny/llama")
    assert model.verified
    ranges = hub.gets_of(WEIGHT)
    assert ranges[0] is None and len(ranges) == 2
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= size // 2  # resumed from what had arrived, not from 0
    assert hub.bytes_sent[WEIGHT] < 2 * size - resumed_at + 1
    assert (model.path / WEIGHT).read_bytes() == hub.repos["tiny/llama"].files[WEIGHT]


def test_cancel_then_resume_after_restart(hub):
    token = CancelToken()
    size = len(hub.repos["tiny/llama"].files[WEIGHT])

    def cancel_mid_weight(p: DownloadProgress) -> None:
        if p.current_file == WEIGHT and any(f.name == WEIGHT and f.done > size // 3 for f in p.files):
            token.cancel()

    with pytest.raises(DownloadCancelled):
        download_model("tiny/llama", on_progress=cancel_mid_weight, cancel=token)
    # Half a model: not listed, but known as a resumable download with bytes on disk.
    assert _names() == []
    [pending] = local_models.pending_downloads()
    assert pending.repo_id == "tiny/llama" and pending.bytes_on_disk > 0
    partial = list((paths.repo_cache_folder("tiny/llama") / "blobs").glob("*.incomplete"))
    assert len(partial) == 1 and 0 < partial[0].stat().st_size < size

    already = partial[0].stat().st_size
    model = download_model("tiny/llama")  # a new call, as after a restart
    assert hub.gets_of(WEIGHT)[-1] == f"bytes={already}-"
    assert hashlib.sha256((model.path / WEIGHT).read_bytes()).hexdigest() == hashlib.sha256(
        hub.repos["tiny/llama"].files[WEIGHT]
    ).hexdigest()
    assert _names() == ["tiny/llama"] and local_models.pending_downloads() == []


def test_unknown_repo_is_a_clear_404(hub):
    with pytest.raises(RepoNotFound, match="no such model"):
        download_model("tiny/does-not-exist")
    assert _names() == [] and local_models.pending_downloads() == []


def test_gated_repo_without_token_then_with_token(hub, monkeypatch):
    with pytest.raises(GatedRepo, match="HF_TOKEN"):
        download_model("tiny/gated-llama")
    assert _names() == []
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(GatedRepo, match="no access"):
        download_model("tiny/gated-llama")
    assert _names() == []
    from tests.app.fake_hub import GOOD_TOKEN

    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert download_model("tiny/gated-llama").verified
    assert _names() == ["tiny/gated-llama"]


def test_corrupt_file_is_rejected_then_redownloaded(hub):
    hub.corrupt.add(("tiny/llama", WEIGHT))
    with pytest.raises(CorruptFile, match=WEIGHT):
        download_model("tiny/llama")
    assert _names() == []  # the other files are fine, but the model is not complete
    blobs = paths.repo_cache_folder("tiny/llama") / "blobs"
    bad_sha = hashlib.sha256(hub.repos["tiny/llama"].files[WEIGHT]).hexdigest()
    assert not (blobs / bad_sha).exists() and not list(blobs.glob("*.incomplete"))

    hub.corrupt.clear()
    assert download_model("tiny/llama").verified
    assert _names() == ["tiny/llama"]


def test_unsupported_architecture_downloads_nothing(hub):
    with pytest.raises(UnsupportedArchitecture, match="GPT2LMHeadModel"):
        download_model("tiny/gpt2ish")
    assert not paths.repo_cache_folder("tiny/gpt2ish").exists()
    assert _names() == [] and local_models.pending_downloads() == []
    # Asked for explicitly, it downloads and is listed with the flag off.
    model = download_model("tiny/gpt2ish", allow_unsupported=True)
    assert not model.supported and _names() == ["tiny/gpt2ish"]


def test_no_network_is_a_clear_error(kvdeck_env, monkeypatch):
    import socket

    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(NetworkError, match="cannot reach"):
        download_model("tiny/llama")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NetworkError, match="OFFLINE"):
        download_model("tiny/llama")


def test_disk_full_is_detected_before_downloading_weights(hub, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(10**9, 10**9, 1000))
    with pytest.raises(Exception, match="not enough disk space") as info:
        download_model("tiny/llama")
    assert type(info.value).__name__ == "DiskFull"
    assert hub.gets_of(WEIGHT) == [] and _names() == []


def test_bad_repo_id_is_a_value_error(kvdeck_env):
    with pytest.raises(ValueError, match="repo id"):
        download_model("../etc/passwd")


def test_delete_removes_model_and_registry_entry(hub):
    model = download_model("tiny/llama")
    assert registry.hf_key("tiny/llama", model.commit) in registry.read()["verified"]
    local_models.delete_model("tiny/llama")
    assert _names() == [] and not paths.repo_cache_folder("tiny/llama").exists()
    assert registry.read()["verified"] == {}
    with pytest.raises(KeyError):
        local_models.delete_model("tiny/llama")


def test_two_concurrent_downloads_share_the_work(hub):
    import threading

    results, errors = [], []

    def pull() -> None:
        try:
            results.append(download_model("tiny/llama"))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(results) == 2
    assert all(m.verified for m in results) and _names() == ["tiny/llama"]
    size = len(hub.repos["tiny/llama"].files[WEIGHT])
    assert hub.bytes_sent[WEIGHT] == size  # fetched once; the other waited for it


def test_pull_by_commit_hash_and_again_is_a_no_op(hub):
    commit = hub.repos["tiny/llama"].commit
    model = download_model("tiny/llama", revision=commit)
    assert model.commit == commit and model.verified
    assert not (paths.repo_cache_folder("tiny/llama") / "refs" / commit).exists()
    gets = len(hub.gets_of(".safetensors"))
    again = download_model("tiny/llama", revision=commit)
    assert again.path == model.path and len(hub.gets_of(".safetensors")) == gets
