"""CPU host-memory settings: glibc keeps freed buffers, the KV pool sits on huge pages."""

import sys
from pathlib import Path

import pytest
import torch

from engine import LLM
from engine.host_memory import keep_freed_buffers_in_process, zeros_on_huge_pages

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_kb_of_mapping(tensor: torch.Tensor) -> int:
    """AnonHugePages of the /proc/self/smaps mapping that holds the tensor's first 2 MB-
    aligned address (madvise splits the mapping there)."""
    address = -(-tensor.data_ptr() // (2 << 20)) * (2 << 20)
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps and THP are Linux's")
def test_kv_pool_on_huge_pages_when_the_kernel_allows(tiny_llama_dir):
    tensor = zeros_on_huge_pages((64, 1 << 18), torch.float32)  # 64 MiB
    assert tensor.shape == (64, 1 << 18) and not tensor.any()
    mode = THP_SETTING.read_text() if THP_SETTING.exists() else "[never]"
    if "[never]" not in mode:  # "always" or "madvise": the request must be honoured
        assert _huge_kb_of_mapping(tensor) >= 32 * 1024
        llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
        k_cache = llm.engine.core.runner.k_caches[0]
        assert _huge_kb_of_mapping(k_cache) > 0


def test_small_and_empty_shapes():
    assert zeros_on_huge_pages((3, 5), torch.float16).dtype == torch.float16
    assert zeros_on_huge_pages((0,), torch.float32).numel() == 0


def test_malloc_setting_applies_on_glibc():
    import platform

    if platform.libc_ver()[0] == "glibc":
        assert keep_freed_buffers_in_process() is True
