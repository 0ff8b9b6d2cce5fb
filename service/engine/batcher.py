"""Dynamic batching of encoder inputs (embedding, fill-mask) across concurrent calls: one queue task per model.

A call's inputs become queue items sharing one future. The queue task waits for a free compute slot
(`workers` batches run at once), lets a batch fill for at most `max_wait_s` after its oldest item
arrived, then takes the run of length-sorted items around the oldest one that fits the token budget
(rows x longest row: padding counted) and the row limit; a packed engine (several inputs per row)
budgets real tokens and takes the oldest items first (asked per batch: an engine may change
layout on the traffic). Rows come back into each call by input index.
Items of a call that was cancelled or whose deadline passed are dropped before compute and counted
in `ts_dropped_items_total`. Admission: `self.admission` (service/admission.py) holds a call's queue
places from its input count before it is tokenized; `enqueue` turns them into queue items.
(TEI `core/src/queue.rs`, `core/src/infer.rs`.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service import metrics
from service.admission import Admission, Gate
from service.engine.tokenization import Encoded
from service.errors import DeadlineExceeded, Unavailable

log = logging.getLogger(__name__)

CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution  # what asyncio allows its timers
Rows = Sequence[Any] | np.ndarray  # one row per input, e.g. a (B, C) array (numpy is no Sequence)
Forward = Callable[[list[Encoded]], Rows]
Gather = Callable[[list[Any]], Any]  # a call's rows, in input order -> what its Outcome carries
RunInExecutor = Callable[..., Awaitable]


@dataclass(frozen=True)
class BatchLimits:
    max_batch_tokens: int
    max_batch_size: int
    max_wait_s: float
    max_queue: int
    workers: int
    grace_s: float = 30.0  # how long stop() lets queued and running calls finish (settings grace_seconds)


@dataclass(eq=False)
class Request:
    """One call in flight: its inputs, its future and the rows gathered so far."""

    encoded: list[Encoded]
    deadline: float | None  # time.monotonic() after which the call has expired
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)
    rows: dict[int, Any] = field(default_factory=dict)
    queue_s: float = 0.0
    inference_s: float = 0.0
    abandoned: bool = False  # future done (cancelled / failed): set on the loop, read by workers

    def abandon(self, _future: asyncio.Future) -> None:
        self.abandoned = True

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


@dataclass(frozen=True)
class Item:
    request: Request
    index: int

    @property
    def tokens(self) -> int:
        return len(self.request.encoded[self.index])


@dataclass(frozen=True)
class Outcome:
    """What a call gets back: its rows gathered in input order (embeddings: (N, C)), and where its time went."""

    outputs: Any
    input_tokens: int
    queue_s: float
    inference_s: float


class Batcher:
    def __init__(
        self,
        model: str,
        forward: Forward,
        run: RunInExecutor,
        limits: BatchLimits,
        gather: Gather = np.stack,
        kind: str = "embedding",
        gate: Gate | None = None,
        packed: Callable[[], bool] | None = None,
    ):
        """`packed` says, per batch, whether the engine packs inputs into rows now (the budget then
        counts real tokens; an engine may change layout on the traffic, service/engine/layout.py);
        without it, batches are padded."""
        self.model, self._forward, self._run, self.limits = model, forward, run, limits
        self._packed = packed or (lambda: False)
        self._gather = gather
        self._queue: list[Item] = []  # arrival order
        self.admission = Admission(
            kind, model, limits.max_queue, "queued inputs", gate=gate, waiting=lambda: len(self._queue)
        )
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(limits.workers)
        self._running: set[asyncio.Task] = set()
        self._computing: Counter[Request] = Counter()  # the calls of the running batches (a call's batches)
        self._stopped = False
        self._task: asyncio.Task | None = None
        # Labelled children resolved once: labels() costs microseconds per call.
        self._depth = metrics.QUEUE_DEPTH.labels(model)
        self._queue_duration = metrics.QUEUE_DURATION.labels(model)
        self._batch_size = metrics.BATCH_SIZE.labels(model)
        self._inference = metrics.INFERENCE_DURATION.labels(model)
        self._input_tokens = metrics.TOKENS.labels(model, "input")
        metrics.QUEUE_CAPACITY.labels(model).set(limits.max_queue)
        self._depth.set(0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.model}")

    async def stop(self) -> None:
        """Refuses new calls, lets queued and running batches finish for up to `limits.grace_s`, then
        fails what is left (queued, computing, admitted but not queued yet) with UNAVAILABLE."""
        self.admission.closing = True
        deadline = time.monotonic() + self.limits.grace_s
        while (self._queue or self._running or self.admission.reserved) and time.monotonic() < deadline:
            self._drop_abandoned()
            await asyncio.sleep(0.005)
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for request in {it.request for it in self._queue} | set(self._computing):
            if not request.future.done():
                request.future.set_exception(self._gone())
        self._queue = []
        self._depth.set(0)

    def _gone(self) -> Unavailable:
        return Unavailable(f"model {self.model!r} shut down before the call was served; retry on another replica")

    def enqueue(self, encoded: list[Encoded], deadline: float | None) -> asyncio.Future:
        """Queues one call's inputs in the places `admission.take` held; the future resolves to an Outcome."""
        self.admission.queued(len(encoded))
        if self._stopped:  # admitted before the stop, tokenized after its grace: nobody would compute it
            raise self._gone()
        request = Request(encoded, deadline, asyncio.get_running_loop().create_future())
        request.future.add_done_callback(request.abandon)
        self._queue.extend(Item(request, i) for i in range(len(encoded)))
        self._depth.set(len(self._queue))
        self._wake.set()
        return request.future

    async def _loop(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            task = asyncio.create_task(self._run_batch(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[Item]:
        """Waits for items, lets the batch fill until the oldest item has waited max_wait_s, takes it."""
        while True:
            self._drop_abandoned()
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            close_at = self._queue[0].request.enqueued + self.limits.max_wait_s
            if not self._full() and close_at - time.monotonic() >= CLOCK_RESOLUTION:
                # A timer sets the event (asyncio.wait_for would create a task per batch). asyncio
                # fires timers up to one clock resolution early: the loop below stops by then too.
                timer = asyncio.get_running_loop().call_at(close_at, self._wake.set)
                try:
                    while not self._full() and close_at - time.monotonic() >= CLOCK_RESOLUTION:
                        self._wake.clear()
                        await self._wake.wait()
                finally:
                    timer.cancel()
            self._drop_abandoned()
            if self._queue:
                return self._take()

    def _full(self) -> bool:
        tokens = sum(it.tokens for it in self._queue)
        return len(self._queue) >= self.limits.max_batch_size or tokens >= self.limits.max_batch_tokens

    def _take(self) -> list[Item]:
        """The run of length-sorted queued items around the oldest that fits the budget (padding counted);
        for a packed engine, the oldest items whose real tokens fit."""
        q = self._queue
        if self._packed():
            count, tokens = 1, q[0].tokens
            while (
                count < min(len(q), self.limits.max_batch_size)
                and tokens + q[count].tokens <= self.limits.max_batch_tokens
            ):
                tokens += q[count].tokens
                count += 1
            self._queue = q[count:]
            self._depth.set(len(self._queue))
            return q[:count]
        order = sorted(range(len(q)), key=lambda i: (q[i].tokens, i))
        lo = hi = order.index(0)  # the oldest item is always in the batch

        def fits(rows: int, width: int) -> bool:
            return rows <= self.limits.max_batch_size and rows * width <= self.limits.max_batch_tokens

        while True:
            rows, width = hi - lo + 2, q[order[hi]].tokens
            if lo > 0 and fits(rows, width):  # a shorter item: the width stays
                lo -= 1
            elif hi + 1 < len(order) and fits(rows, q[order[hi + 1]].tokens):
                hi += 1
            else:
                break
        chosen = set(order[lo : hi + 1])
        self._queue = [it for i, it in enumerate(q) if i not in chosen]
        self._depth.set(len(self._queue))
        return [q[i] for i in order[lo : hi + 1]]

    def _drop_abandoned(self) -> None:
        now = time.monotonic()
        keep = [it for it in self._queue if not self._dropped(it, now)]
        if len(keep) != len(self._queue):
            self._queue = keep
            self._depth.set(len(keep))

    def _dropped(self, item: Item, now: float) -> bool:
        """True (and counted) when the item's call went away or expired; fails an expired call."""
        request = item.request
        if request.expired(now) and not request.future.done():
            request.future.set_exception(
                DeadlineExceeded(
                    f"the call's deadline passed after {now - request.enqueued:.3f}s in the queue of {self.model!r}; "
                    "allow more time or retry"
                )
            )
        if not (request.abandoned or request.future.done()):
            return False
        reason = "expired" if request.expired(now) else "cancelled" if request.future.cancelled() else "failed"
        metrics.DROPPED.labels(self.model, reason).inc()
        return True

    async def _run_batch(self, batch: list[Item]) -> None:
        requests = {it.request for it in batch}
        self._computing.update(requests)
        try:
            started = time.monotonic()
            for it in batch:
                self._queue_duration.observe(started - it.request.enqueued)
                it.request.queue_s = max(it.request.queue_s, started - it.request.enqueued)
            try:
                live, out, seconds = await self._run(self._compute, batch)
            except Exception as exc:
                log.error("model %s: batch of %d failed", self.model, len(batch), exc_info=exc)
                for request in {it.request for it in batch}:
                    if not request.future.done():
                        request.future.set_exception(exc)
                return
            now, computed = time.monotonic(), set(live)
            for it in batch:
                if it not in computed:
                    self._dropped(it, now)
            if live:
                self._record(live, seconds)
                self._scatter(live, out, seconds)
        finally:
            self._computing.subtract(requests)
            self._computing += Counter()  # drops the calls no running batch holds
            self._slots.release()

    def _compute(self, batch: list[Item]) -> tuple[list[Item], Rows | None, float]:
        """Worker thread: drops items whose call went away, runs the forward pass on the rest."""
        now = time.monotonic()
        live = [it for it in batch if not it.request.abandoned and not it.request.expired(now)]
        if not live:
            return live, None, 0.0
        start = time.perf_counter()
        out = self._forward([it.request.encoded[it.index] for it in live])  # B rows
        return live, out, time.perf_counter() - start

    def _record(self, live: list[Item], seconds: float) -> None:
        self._batch_size.observe(len(live))
        self._inference.observe(seconds)
        self._input_tokens.inc(sum(it.tokens for it in live))

    def _scatter(self, live: list[Item], out: Rows, seconds: float) -> None:
        for request in {it.request for it in live}:
            request.inference_s += seconds
        for it, row in zip(live, out, strict=True):
            request = it.request
            request.rows[it.index] = row
            if len(request.rows) == len(request.encoded) and not request.future.done():
                outputs = self._gather([request.rows[i] for i in range(len(request.encoded))])  # (N, C) by default
                tokens = sum(len(e) for e in request.encoded)
                request.future.set_result(Outcome(outputs, tokens, request.queue_s, request.inference_s))
