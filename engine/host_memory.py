"""Host allocator settings for running the model on the CPU."""

import ctypes
import ctypes.util
import functools
import logging
import sys

logger = logging.getLogger(__name__)

# mallopt parameters from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD_BYTES = 1 << 30


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
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # musl and others: no mallopt
            mallopt = None
        if mallopt is not None:
            applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
                mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    logger.debug("glibc malloc tuned for tensor reuse: %s", applied)
    return applied
