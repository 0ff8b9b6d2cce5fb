"""The Batcher alone, with a real (numpy) forward function: budgets, ordering, merging back.

The forward function returns, per row, [token count, first id, batch width]: enough to check that
every row comes back to its call at its index and that no batch broke the budget (padding counted).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.engine.batcher import Batcher, BatchLimits
from service.engine.tokenization import Encoded
from service.errors import Unavailable


def encoded(call: int, lengths: list[int]) -> list[Encoded]:
    return [Encoded([call * 1000 + i] + [7] * (n - 1), [0] * n) for i, n in enumerate(lengths)]


async def run_calls(
    calls: list[list[int]], limits: BatchLimits, packed=None
) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    shapes: list[tuple[int, int]] = []  # (rows, width) of every batch

    def forward(batch: list[Encoded]) -> np.ndarray:
        width = max(len(e) for e in batch)
        shapes.append((len(batch), width))
        return np.array([[len(e), e.ids[0], width] for e in batch], dtype=np.float32)  # (B, 3)

    executor = ThreadPoolExecutor(limits.workers)

    async def run(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    batcher = Batcher("unit", forward, run, limits, packed=packed)
    batcher.start()
    try:
        futures = []
        for c, lengths in enumerate(calls):
            batcher.admission.take(len(lengths))
            futures.append(batcher.enqueue(encoded(c, lengths), deadline=None))
        outcomes = await asyncio.gather(*futures)
    finally:
        await batcher.stop()
        executor.shutdown()
    return [o.outputs for o in outcomes], shapes


@settings(max_examples=40, deadline=None)
@given(
    calls=st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=12), min_size=1, max_size=8),
    budget=st.integers(40, 200),
    rows=st.integers(1, 8),
    workers=st.integers(1, 3),
)
def test_rows_merge_back_in_order_within_budget(calls, budget, rows, workers):
    limits = BatchLimits(max_batch_tokens=budget, max_batch_size=rows, max_wait_s=0.0, max_queue=1000, workers=workers)
    results, shapes = asyncio.run(run_calls(calls, limits))
    for c, (lengths, out) in enumerate(zip(calls, results, strict=True)):
        np.testing.assert_array_equal(out[:, 0], lengths)  # each row is its own input's
        np.testing.assert_array_equal(out[:, 1], [c * 1000 + i for i in range(len(lengths))])
    assert sum(r for r, _ in shapes) == sum(len(c) for c in calls)  # every input computed exactly once
    assert all(r <= rows and r * w <= budget for r, w in shapes)  # budgets hold (every input fits alone)


def test_length_sorting_cuts_padding():
    """Short and long inputs queued together are batched by length, not arrival order."""
    calls = [[4], [40], [4], [40], [4], [40], [4], [40]]
    limits = BatchLimits(max_batch_tokens=160, max_batch_size=4, max_wait_s=0.05, max_queue=100, workers=1)
    _, shapes = asyncio.run(run_calls(calls, limits))
    assert sorted(shapes) == [(4, 4), (4, 40)]  # arrival order would pad every batch to 40


def test_the_engines_layout_is_asked_per_batch():
    """An engine that packs takes the oldest inputs first (real tokens budgeted); once it serves
    padded (an adaptive engine switched), the same queue is batched by length again."""
    calls = [[4], [40], [4], [40], [4], [40], [4], [40]]
    limits = BatchLimits(max_batch_tokens=160, max_batch_size=4, max_wait_s=0.05, max_queue=100, workers=1)
    _, shapes = asyncio.run(run_calls(calls, limits, packed=lambda: True))
    assert shapes == [(4, 40), (4, 40)]  # arrival order: 4 + 40 + 4 + 40 real tokens a batch
    asked: list[bool] = []

    def switched() -> bool:  # packed for the first batch, padded after
        asked.append(not asked)
        return asked[-1]

    _, shapes = asyncio.run(run_calls(calls + calls, limits, packed=switched))
    assert shapes[0] == (4, 40) and sorted(shapes[1:]) == [(4, 4), (4, 40), (4, 40)]  # 6 short, 6 long left
    assert len(asked) == len(shapes)


def test_stop_is_bounded_by_the_grace_and_fails_what_is_left():
    """A batch that never ends, a call queued behind it and places taken but never queued: stop() returns
    after its grace, every call left gets UNAVAILABLE, and a late enqueue is refused, not left hanging."""

    async def scenario():
        release = threading.Event()

        def forward(batch: list[Encoded]) -> np.ndarray:
            release.wait(30)  # stuck until the test lets it go
            return np.zeros((len(batch), 1), dtype=np.float32)

        executor = ThreadPoolExecutor(1)

        async def run(fn, *args):
            return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

        limits = BatchLimits(
            max_batch_tokens=100, max_batch_size=1, max_wait_s=0.0, max_queue=10, workers=1, grace_s=0.2
        )
        batcher = Batcher("unit", forward, run, limits)
        batcher.start()
        try:
            batcher.admission.take(2)
            computing = batcher.enqueue(encoded(0, [3]), deadline=None)
            queued = batcher.enqueue(encoded(1, [3]), deadline=None)
            batcher.admission.take(1)  # admitted, still being tokenized when the stop starts
            await asyncio.sleep(0.05)  # the first batch is in the executor now
            await asyncio.wait_for(batcher.stop(), timeout=5)
            for future in (computing, queued):
                with pytest.raises(Unavailable, match="'unit' shut down before the call was served"):
                    await future
            with pytest.raises(Unavailable):
                batcher.enqueue(encoded(2, [3]), deadline=None)
        finally:
            release.set()
            executor.shutdown()

    asyncio.run(scenario())
