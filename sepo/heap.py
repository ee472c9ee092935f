"""Handing memory that no object uses any more back to the system, between phases of one process.

glibc's malloc keeps the pages of freed blocks in its heap while a live block sits above them, and after
large frees it serves ever larger blocks (up to 32 MB) from that heap instead of mapping them, so a
process's resident memory stays near the peak of its heaviest phase. The smollm2 pipeline carried SFT's
working set into SEPO that way, and within a SEPO step each phase (rollouts, reference pass, update) ran on
top of the pages the one before had freed: the process peaked at 3.6 GiB where no phase needs more than
2.6. `malloc_trim(0)` returns those pages; on a GPU the caching allocator's unused blocks go back too.
Elsewhere (no glibc) it only collects garbage.
"""

from __future__ import annotations

import ctypes
import gc
import sys


def resident_mib() -> float | None:
    """The process's resident memory now, in MiB (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def release_freed_memory(gpu: bool = True) -> None:
    """Collect garbage, then return the allocators' free pages: glibc's heap and, with `gpu`, where torch
    is loaded and a GPU is in use, CUDA's cache (between a run's phases; not between the passes of a
    step, which would only make CUDA allocate the same blocks again)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if gpu and torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    trim_heap()


def trim_heap() -> None:
    """glibc's `malloc_trim(0)` alone: the heap's free pages back to the system (no-op without glibc).

    Enough where what was freed is tensors, which go with their last reference, and cheap enough for a hot
    loop: a garbage collection scans every live object of the process (0.2-0.3 s a call once a model is
    loaded; docs/speed.md §5p)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
