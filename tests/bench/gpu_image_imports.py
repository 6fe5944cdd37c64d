"""Run `kvdeck ARGS...` as the lent GPU image would: only torch, triton, transformers,
safetensors, numpy (and what those need) importable. Every other third-party package kvdeck
depends on is blocked; importing one fails loudly, naming it.

    python tests/bench/gpu_image_imports.py bench decode --model DIR ...
"""

import importlib.abc
import runpy
import sys

# kvdeck's dependencies that the GPU image does not have (pyproject.toml minus the five, and
# minus httpx: the image's transformers 5.17 needs huggingface_hub 1.x, which needs httpx and
# imports it with transformers).
ABSENT_ON_GPU_IMAGE = ("textual", "textual_plotext", "plotext", "fastapi", "starlette", "uvicorn",
                       "prometheus_client", "platformdirs", "bitsandbytes", "matplotlib",
                       "openai", "pydantic", "llguidance", "xgrammar")


class BlockAbsent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT_ON_GPU_IMAGE:
            raise ImportError(f"{name} is not on the GPU image (blocked by {__file__})")
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, BlockAbsent())
    sys.argv = ["kvdeck", *sys.argv[1:]]
    runpy.run_module("kvdeck", run_name="__main__")
