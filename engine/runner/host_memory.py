"""Host memory settings for running the model on the CPU: glibc's allocator, and huge
pages for the KV cache."""

import ctypes
import ctypes.util
import functools
import logging
import sys

import torch

from kvdeck.engine.types.arith import cdiv

logger = logging.getLogger(__name__)

# mallopt parameters from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD_BYTES = 1 << 30
MADV_HUGEPAGE = 14  # from linux/mman.h
HUGE_PAGE_BYTES = 2 << 20


@functools.cache
def keep_freed_buffers_in_process() -> bool:
    """Make glibc reuse freed tensor buffers instead of handing them back to the kernel.

    A forward pass frees and re-allocates activation and gathered-KV buffers of a few MB
    per op. By default glibc returns each to the kernel (munmap, heap trim) and the next
    op page-faults fresh zeroed pages in: on a small model that costs as much as the
    attention itself. vLLM's CPU backend asks users to preload tcmalloc for this reason;
    this is the in-process equivalent. Returns whether the setting took (glibc only).
    """
    applied = False
    mallopt = _libc_function("mallopt")
    if mallopt is not None:
        applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    logger.debug("glibc malloc tuned for tensor reuse: %s", applied)
    return applied


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor whose memory the kernel backs with 2 MB pages where it can.

    Attention reads the KV pool block by block all over a region of a GB or more; with
    4 KB pages nearly every block is a TLB miss. Transparent huge pages are often enabled
    only for regions that ask (`madvise` mode), so this asks before the first touch.
    Elsewhere (no glibc, THP off) it is a plain torch.zeros.
    """
    tensor = torch.empty(shape, dtype=dtype)
    start = cdiv(tensor.data_ptr(), HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    madvise = _libc_function("madvise")
    if madvise is not None and end > start:
        if madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) != 0:
            logger.debug("madvise(MADV_HUGEPAGE) refused: the KV cache stays on 4 KB pages")
    return tensor.zero_()


@functools.cache
def _libc_function(name: str):
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # musl and others
        return None
