"""kvdeck installs as one import namespace, `kvdeck.*`, from a wheel that runs anywhere.

Builds the wheel, installs it (no editable install, no checkout on the path) into a fresh
venv that borrows only the third-party packages of the test venv, and runs it from a
directory outside the checkout.
"""

import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from kvdeck.kernels.cpu import build

REPO = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("app", "assets", "engine", "kernels", "quant", "tui")
HF_KERNELS = "kernels==0.17.2"  # Hugging Face's package whose name kvdeck's folder used to shadow

pytestmark = pytest.mark.timeout(600)


def run(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "-w", str(out), str(REPO), cwd=out)
    (built,) = out.glob("kvdeck-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", str(root / "venv"), cwd=root)
    python = root / "venv" / "bin" / "python"
    # Torch and friends come from the test venv's site-packages as a plain path entry: its
    # .pth files (the editable install of the checkout among them) are not processed.
    site = Path(run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=root).stdout.strip())
    (site / "test_venv_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel), cwd=root)
    return root / "venv"


def test_the_wheel_holds_only_the_kvdeck_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"kvdeck"}
    packages = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    on_disk = {"kvdeck"} | {
        "kvdeck." + str(init.parent.relative_to(REPO)).replace("/", ".")
        for folder in PACKAGE_FOLDERS for init in (REPO / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert packages == on_disk, "pyproject.toml's package list and the folders disagree"
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert set(listed) == on_disk
    for data in ("kvdeck/assets/demo_model/model.safetensors", "kvdeck/assets/demo_model/tokenizer.json",
                 "kvdeck/assets/demo_draft/model.safetensors",
                 "kvdeck/assets/calibration/calibration.txt", "kvdeck/tui/styles/kvdeck.tcss",
                 # the native CPU kernels' sources, compiled at first use (kernels/cpu/build.py)
                 *(f"kvdeck/kernels/cpu/{source.name}" for source in (*build.SOURCES, *build.HEADERS))):
        assert data in names, f"package data {data} is missing from the wheel"


def test_installed_wheel_runs_from_any_directory(fresh_venv, tmp_path):
    help_text = run(str(fresh_venv / "bin" / "kvdeck"), "--help", cwd=tmp_path).stdout
    assert "usage: kvdeck" in help_text and "--serve" in help_text
    code = (
        "import kvdeck\n"
        "from kvdeck import LLM, SamplingParams\n"
        "with LLM(kv_cache_memory_gib=0.01) as llm:\n"
        "    out = llm.generate('The engine', SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))\n"
        "print(len(out[0].outputs[0].token_ids), kvdeck.__file__)\n"
    )
    printed = run(str(fresh_venv / "bin" / "python"), "-c", code, cwd=tmp_path).stdout.split()
    assert printed[0] == "4"
    assert Path(printed[1]).is_relative_to(fresh_venv), "kvdeck came from the checkout, not the wheel"


def test_no_generic_top_level_packages_and_hf_kernels_imports_beside(fresh_venv, tmp_path):
    python = str(fresh_venv / "bin" / "python")
    probe = ("import importlib.util\n"
             f"print([n for n in {PACKAGE_FOLDERS!r} if importlib.util.find_spec(n)])\n")
    assert run(python, "-c", probe, cwd=tmp_path).stdout.strip() == "[]"
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", HF_KERNELS],
                             capture_output=True, text=True, timeout=300)
    if install.returncode != 0:
        pytest.skip(f"{HF_KERNELS} could not be installed: {install.stderr.strip()[-300:]}")
    both = ("import kernels, kvdeck.kernels.dispatch\n"
            "print(hasattr(kernels, 'get_kernel'), kvdeck.kernels.dispatch.select_ops.__name__)\n")
    assert run(python, "-c", both, cwd=tmp_path).stdout.split() == ["True", "select_ops"]
