"""CPU host-memory settings: glibc keeps freed buffers, the KV pool sits on huge pages."""

import sys
from pathlib import Path

import pytest
import torch

from kvdeck import LLM
from kvdeck.engine.runner.host_memory import keep_freed_buffers_in_process, zeros_on_huge_pages

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _mapping_of(tensor: torch.Tensor) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds the tensor's first 2 MB-aligned
    address (madvise splits the mapping there)."""
    address = -(-tensor.data_ptr() // (2 << 20)) * (2 << 20)
    fields: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            if fields is not None:
                return fields
            low, high = (int(x, 16) for x in head.split("-"))
            fields = {} if low <= address < high else None
        elif fields is not None:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields or {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps and THP are Linux's")
def test_kv_pool_asks_for_huge_pages(tiny_llama_dir):
    tensor = zeros_on_huge_pages((64, 1 << 18), torch.float32)  # 64 MiB
    assert tensor.shape == (64, 1 << 18) and not tensor.any()
    mode = THP_SETTING.read_text() if THP_SETTING.exists() else "[never]"
    if "[never]" not in mode:
        # The region is marked for huge pages (VmFlags "hg"); whether the kernel found 2 MB
        # pages for it at that moment depends on its free memory, not on kvdeck.
        assert "hg" in _mapping_of(tensor)["VmFlags"].split()
        llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
        assert "hg" in _mapping_of(llm.engine.core.runner.k_caches[0])["VmFlags"].split()


def test_small_and_empty_shapes():
    assert zeros_on_huge_pages((3, 5), torch.float16).dtype == torch.float16
    assert zeros_on_huge_pages((0,), torch.float32).numel() == 0


def test_malloc_setting_applies_on_glibc():
    import platform

    if platform.libc_ver()[0] == "glibc":
        assert keep_freed_buffers_in_process() is True
