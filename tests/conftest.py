import os

# Triton kernels run under the interpreter on CPU; it must be set before triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist's two workers each takes one core: two 2-thread pools on 2 cores stall.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by the engine processes tests spawn
    torch.set_num_threads(1)
else:
    torch.set_num_threads(2)

from tests.model_factory import build_tiny_model  # noqa: E402

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


DEFAULT_SLOW_SECONDS = 10


def pytest_collection_modifyitems(config, items):
    """The files with the longest tests run first (stable otherwise), so that under
    pytest-xdist's `--dist loadfile` the longest ones start at once rather than leave one
    worker running them alone at the end. A test's `slow(seconds=...)` mark says how long."""

    def weight(item) -> float:
        mark = item.get_closest_marker("slow")
        return mark.kwargs.get("seconds", DEFAULT_SLOW_SECONDS) if mark else 0.0

    file_weight: dict[Path, float] = {}
    for item in items:
        file_weight[item.path] = max(file_weight.get(item.path, 0.0), weight(item))
    items.sort(key=lambda item: -file_weight[item.path])


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {family: build_tiny_model(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs) -> Path:
    return tiny_model_dirs["llama"]


@pytest.fixture
def listed_tiny_llama(tiny_llama_dir, tmp_path, monkeypatch) -> str:
    """The tiny Llama in a fresh kvdeck store (KVDECK_HOME), listed as `tiny-listed`: the
    name `kvdeck models` shows and commands take in place of a folder."""
    import shutil

    from kvdeck.app.store.paths import store_dir

    monkeypatch.setenv("KVDECK_HOME", str(tmp_path / "home"))
    shutil.copytree(tiny_llama_dir, store_dir() / "tiny-listed")
    return "tiny-listed"


@pytest.fixture
def no_decoder_stack(monkeypatch):
    """Every model on its per-layer forward: the native decoder stack (which takes CPU
    decode steps of up to 8 rows in bf16, ahead of any decode graph) is not bound, so a test of the
    graph machinery sees its small steps."""
    from kvdeck.engine.runner.models import native_decode

    monkeypatch.setattr(native_decode, "bind_decoder_stack", lambda model: False)
