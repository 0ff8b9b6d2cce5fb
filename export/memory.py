"""Giving a conversion's freed memory back to the system between its stages.

A 1B conversion moves several 4.4 GB copies of the weights through one process in turn (the
PyTorch model, the exported graph as a protobuf, each variant built from it). glibc keeps what
was freed for reuse unless told otherwise: allocations above its mmap threshold are returned at
once, but that threshold rises to each freed block's size (up to 32 MiB), after which a layer's
16 MB weights land on the heap and stay mapped after they are freed, so each stage's peak adds
to the last. `settle()` fixes the threshold (no rise) and `release()` trims the heap after a stage.
Both are no-ops where the C library is not glibc.

Every block mapped afresh costs a page fault per page touched: GPT-2 small's default conversion
took 22.4 million minor faults (85 GB of 4 KiB pages zeroed by the kernel), 75 of its 178 s in
the kernel, on an AMD EPYC VM. `python -m export` therefore runs in a process whose malloc asks for
transparent huge pages (glibc's `glibc.malloc.hugetlb=1` tunable, read at start:
`huge_pages_env` in service/memory.py; export/__main__.py runs the CLI again with it, as
`python -m service` does), where the kernel grants them on request
(/sys/kernel/mm/transparent_hugepage/enabled `madvise`): 2 MiB pages, a fault per 512 of the
small ones (4.5 million faults, 36 s in the kernel, 119 s in all for that conversion).
`GLIBC_TUNABLES=glibc.malloc.hugetlb=0` in the caller's environment opts out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20  # blocks of 1 MiB and more are mapped, and unmapped when freed

_libc = None


def _glibc():
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else False
        except OSError:
            _libc = False
    return _libc or None


def settle() -> None:
    """Large blocks mapped and unmapped from now on (a fixed mmap threshold), where glibc is used."""
    lib = _glibc()
    if lib is not None and not lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")


def release() -> None:
    """The heap's free memory back to the system (glibc's malloc_trim), after a stage's copies are gone."""
    import gc

    gc.collect()
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)
