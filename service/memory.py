"""Memory given back to the system after large requests: glibc's `malloc_trim`, when it helps.

A large request passes through allocations of hundreds of MB (the tokenizer's encodings, protobuf
and JSON copies); freed, that memory stays resident in glibc's arenas (figures:
docs/design/robustness.md, "Memory goes back"). Two things give it back:
- blocks of MMAP_BYTES and more are mapped on their own (`mallopt(M_MMAP_THRESHOLD)`, set once
  when the trimmer is built), so a freed request buffer goes back at once. glibc's default
  threshold rises to the largest block freed (up to 32 MiB), after which 15 MB request copies came
  from the arenas and stayed there, fragmented;
- `MemoryTrimmer.run`, a server task: every CHECK_S seconds it reads the process's resident memory
  (/proc/self/statm) and the bytes free in glibc's arenas (`mallinfo2`); when either grew by
  TRIM_BYTES over the lowest it has read since the last trim, or the last trim gave back TRIM_BYTES
  or more (memory was on the move: a trim in the middle of a request sees that request's memory in
  use, and what the request frees afterwards may land in chunks already counted free), it collects
  garbage cycles (a refused call's exception, traceback and request can form one) and calls
  `malloc_trim(0)` in a thread.
Memory in use is not touched, a server whose memory is flat never trims, one that grew trims until
a trim gives back little, and without glibc (musl, macOS) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import platform
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

CHECK_S = 5.0  # seconds between two looks
TRIM_BYTES = 32 << 20  # growth of resident or free memory that makes a trim worth it
MMAP_BYTES = 1 << 20  # blocks this large and larger are mapped on their own, unmapped when freed
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33 (no mallinfo2)
        return None


def resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * PAGE


class MemoryTrimmer:
    def __init__(self, check_s: float = CHECK_S, trim_bytes: int = TRIM_BYTES):
        self.check_s, self.trim_bytes = check_s, trim_bytes
        self._libc = _glibc()
        self._resident = self._free = 0  # the lowest of each read since the last trim
        self._released = 0  # what the last trim gave back
        self.trims = 0
        if self._libc is not None:
            self._libc.mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)

    def _free_bytes(self) -> int:
        assert self._libc is not None  # run() returns at once without glibc
        return self._libc.mallinfo2().fordblks

    def due(self, resident: int, free: int) -> bool:
        """One look: resident or free memory grew by trim_bytes over its lowest since the last trim,
        or the last trim gave back trim_bytes or more."""
        self._resident, self._free = min(self._resident, resident), min(self._free, free)
        return (
            resident - self._resident > self.trim_bytes
            or free - self._free > self.trim_bytes
            or self._released >= self.trim_bytes
        )

    def trimmed(self, before: int, resident: int, free: int) -> None:
        """A trim took resident memory from `before` to `resident`, leaving `free` bytes in the arenas."""
        self._resident, self._free, self._released = resident, free, max(0, before - resident)
        self.trims += 1

    def trim(self) -> None:
        before = resident_bytes()
        assert self._libc is not None
        self._libc.malloc_trim(0)
        self.trimmed(before, resident_bytes(), self._free_bytes())
        log.debug("malloc_trim: resident %d -> %d MiB", before >> 20, self._resident >> 20)

    async def run(self) -> None:
        if self._libc is None:
            log.info("memory: not glibc, freed memory is left to the allocator")
            return
        self._resident, self._free = resident_bytes(), self._free_bytes()
        while True:
            await asyncio.sleep(self.check_s)
            if self.due(resident_bytes(), self._free_bytes()):
                gc.collect()  # on the loop: finalizers of asyncio and grpc objects expect its thread
                await asyncio.to_thread(self.trim)


HUGETLB = "glibc.malloc.hugetlb"  # glibc 2.35+: 1 = madvise(MADV_HUGEPAGE) on what malloc maps
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_env(environ: Mapping[str, str], thp: Path = THP_ENABLED) -> dict[str, str] | None:
    """environ with glibc's malloc asking for transparent huge pages (GLIBC_TUNABLES gains
    `glibc.malloc.hugetlb=1`), or None where that would change nothing: the caller's tunables
    already say (either way), the kernel grants huge pages only on request and this is not so
    (`always` needs no asking, `never` refuses), or the C library is not glibc 2.35 or newer.

    `python -m service` and `python -m export` run again with it (glibc reads its tunables at
    start). The service's decode steps read the KV cache in small pieces spread over gigabytes
    (a row's keys per head, per layer) and its weights whole every step: on 4 KiB pages the TLB
    misses cost GPT-2 small's int8 8-row step 4-5 % (docs/performance.md). Opt out with
    `GLIBC_TUNABLES=glibc.malloc.hugetlb=0`."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if HUGETLB in tunables:
        return None
    library, version = platform.libc_ver()
    try:
        if library != "glibc" or tuple(map(int, version.split(".")[:2])) < (2, 35):
            return None
        if "[madvise]" not in thp.read_text():
            return None
    except (OSError, ValueError):
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(t for t in (tunables, f"{HUGETLB}=1") if t)}
