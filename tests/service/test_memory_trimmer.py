"""When MemoryTrimmer trims: its decision on a sequence of looks, and one trim of memory this process
really freed. The end-to-end figure (a server process's RSS after large requests) is in
test_hostile_doors.py."""

from __future__ import annotations

import ctypes

import pytest

from service.memory import MemoryTrimmer, resident_bytes

MiB = 1 << 20


def trimmer() -> MemoryTrimmer:
    t = MemoryTrimmer(trim_bytes=32 * MiB)
    t.trimmed(before=120 * MiB, resident=120 * MiB, free=10 * MiB)  # as after a trim that gave back nothing
    return t


def test_flat_memory_never_trims():
    t = trimmer()
    assert not any(t.due(120 * MiB + i * MiB, 10 * MiB + i * MiB) for i in range(20))


def test_resident_or_free_growth_trims():
    assert trimmer().due(160 * MiB, 10 * MiB)
    assert trimmer().due(120 * MiB, 50 * MiB)


def test_growth_counts_from_the_lowest_look_since_the_trim():
    """A request reuses free chunks (free falls at one look), then frees them again: the rise from that
    low is memory given back, though free bytes are where they were right after the trim."""
    t = trimmer()
    t.trimmed(before=700 * MiB, resident=544 * MiB, free=600 * MiB)  # mid-request: much of it in use
    assert t.due(544 * MiB, 600 * MiB)  # the trim gave back 156 MiB: look again
    t.trimmed(before=544 * MiB, resident=540 * MiB, free=600 * MiB)
    assert not t.due(560 * MiB, 300 * MiB)  # the request takes free chunks back (resident +16 MiB)
    assert t.due(560 * MiB, 600 * MiB)  # and frees them: +300 MiB over the lowest look


def test_a_trim_that_gave_back_much_is_followed_by_one_more_then_none():
    t = trimmer()
    t.trimmed(before=698 * MiB, resident=274 * MiB, free=445 * MiB)
    assert t.due(274 * MiB, 445 * MiB)  # nothing grew, but memory was on the move
    t.trimmed(before=274 * MiB, resident=270 * MiB, free=445 * MiB)
    assert not t.due(270 * MiB, 445 * MiB)


def test_a_trim_gives_back_what_this_process_freed():
    t = MemoryTrimmer()
    if t._libc is None:
        pytest.skip("not glibc")
    t.trimmed(resident_bytes(), resident_bytes(), t._free_bytes())
    blocks = [ctypes.create_string_buffer(64 << 10) for _ in range(4096)]  # 256 MiB from the arenas
    kept = blocks[1::2]  # every other block stays: the freed ones are holes glibc does not give back itself
    del blocks
    held = resident_bytes()
    assert t.due(held, t._free_bytes())
    t.trim()
    assert resident_bytes() < held - 96 * MiB
    del kept
