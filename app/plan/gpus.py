"""Common cards: memory, memory bandwidth and dense bf16 tensor throughput, from the vendors'
spec sheets (NVIDIA's product pages and architecture whitepapers: dense figures, not the
2:4-sparse ones; GeForce cards at bf16 with fp32 accumulate)."""

import difflib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory_gib: float  # what the driver reports as total (binary GiB)
    bandwidth_gb_s: float  # peak DRAM bandwidth, decimal GB/s
    bf16_tflops: float  # dense bf16 tensor-core peak


GPUS = [
    GPU("RTX 3090", 24.0, 936.0, 71.0),
    GPU("RTX 4070 Ti", 12.0, 504.0, 80.2),
    GPU("RTX 4080", 16.0, 716.8, 97.5),
    GPU("RTX 4090", 24.0, 1008.0, 165.2),
    GPU("RTX 5090", 32.0, 1792.0, 209.5),
    GPU("RTX A4000", 16.0, 448.0, 76.7),
    GPU("RTX A5000", 24.0, 768.0, 111.1),
    GPU("RTX A6000", 48.0, 768.0, 154.8),
    GPU("RTX 6000 Ada", 48.0, 960.0, 364.2),
    GPU("L4", 24.0, 300.0, 121.0),
    GPU("L40S", 48.0, 864.0, 362.1),
    GPU("A100 40GB", 40.0, 1555.0, 312.0),
    GPU("A100 80GB", 80.0, 2039.0, 312.0),
    GPU("H100 PCIe", 79.6, 2000.0, 756.0),
    GPU("H100", 79.6, 3350.0, 989.0),  # SXM
    GPU("H200", 140.4, 4800.0, 989.0),
]


def _key(name: str) -> str:
    """"rtx4090", "RTX 4090", "4090" and "geforce rtx 4090" name the same card."""
    key = name.lower()
    for word in ("nvidia", "geforce", "rtx", "-", "_", " "):
        key = key.replace(word, "")
    return key


_BY_KEY = {_key(gpu.name): gpu for gpu in GPUS}
_BY_KEY.update({"h100sxm": _BY_KEY["h100"], "a100": _BY_KEY["a10080gb"]})


def find_gpu(name: str) -> GPU:
    """The card called `name`, or ValueError listing the known ones (and the closest)."""
    gpu = _BY_KEY.get(_key(name))
    if gpu is not None:
        return gpu
    names = [g.name for g in GPUS]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown GPU {name!r}{hint}; known: {', '.join(names)} "
                     "(or give the pool size with --num-blocks)")
