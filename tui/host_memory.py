"""What memory a model has to fit in here: free GPU memory (nvidia-smi, so the UI process
never creates a CUDA context), else the free RAM the CPU engine would use."""

from __future__ import annotations

import os
import shutil
import subprocess


def nvidia_smi_free_bytes() -> int | None:
    """Free memory of GPU 0, or None when there is no NVIDIA GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout  # fmt: skip
        return int(out.splitlines()[0].strip()) * 1024 * 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def available_ram_bytes() -> int | None:
    """MemAvailable (Linux), else free pages; None when the system will not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
