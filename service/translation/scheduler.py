"""Continuous batching for one translation model: one asyncio task owns the decoder batch.

Each turn of the loop (like service/generation/scheduler.py for generation):
1. sources of cancelled calls are dropped; waiting sources are admitted in arrival order while
   their rows (k each: beam size, 1 for greedy) fit in `max_rows`, greedy and beam alike;
2. in the compute executor, the newcomers' encoder runs (for them only; packed where the model
   has a packed encoder graph: service/translation/encoder.py) and their rows join the
   batch (engine.Seq2SeqBatch); then decoder steps run back to back until waiting sources fit
   (a quarter of the rows free, or the head waited `JOIN_AFTER_STEPS` steps), a call is
   cancelled, or `SLICE_S` passes (a thread hand-off per step costs milliseconds on a busy CPU);
3. sources that end are handed to the loop as they end (call_soon_threadsafe) and resolve their
   futures there; their rows leave at once, so a long beam search no longer holds the queue.
Isolation: an exception in one source's search or encoding fails that source only. A decoder call
that fails for the whole batch cannot name its culprit: every source in it restarts alone
("isolated": admitted into an empty batch, nothing joins it), so only the culprit fails.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from service import metrics
from service.admission import Admission, Gate
from service.errors import DeadlineExceeded, Unavailable
from service.translation import encoder as source_encoder
from service.translation.engine import Seq2SeqBatch
from service.translation.search import SourceSearch

log = logging.getLogger(__name__)

SLICE_S = 0.25  # longest run of decoder steps between two visits of the event loop
JOIN_AFTER_STEPS = 8  # most steps a source that fits waits for others to join with it
Ended = list[tuple[SourceSearch, BaseException | None]]


@dataclass(eq=False)
class Item:
    """One source of a call: its tokens, its search (own options) and the future of its hypothesis."""

    ids: list[int]
    search: SourceSearch
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    deadline: float | None = None  # time.monotonic() after which the call has expired
    isolated: bool = False  # restarting alone after a batch failure
    queue_s: float = 0.0
    inference_s: float = 0.0  # compute time of the steps its rows were in


class Seq2SeqScheduler:
    def __init__(
        self,
        name: str,
        encoder,
        decoder,
        io,
        runtime,
        *,
        max_rows: int,
        max_queue: int,
        pad_id: int,
        device: str | None,
        max_positions: int,
        pack_row_tokens: int | None = None,
        pack_align: int = 1,
        gate: Gate | None = None,
    ):
        """pack_row_tokens: None for a padded encoder graph, else a packed one's row length
        (service/translation/encoder.py); pack_align: where a packed source may start;
        max_positions: the decoder's positions, the most a row caches."""
        self.name, self.encoder, self.runtime = name, encoder, runtime
        self.pack_row_tokens, self.pack_align = pack_row_tokens, pack_align
        self.max_rows, self.pad_id = max_rows, pad_id
        self.batch = Seq2SeqBatch(decoder, io, device, max_positions)
        self.queue: deque[Item] = deque()
        self.members: dict[int, Item] = {}  # id(item.search) -> item, for sources in the batch
        self._inference = metrics.INFERENCE_DURATION.labels(name)  # one engine run: an encoder run or a step
        self.admission = Admission(
            "translation", name, max_queue, "queued sources", gate=gate, waiting=lambda: len(self.queue)
        )
        self.turns = 0  # executor calls so far
        self._solo = False  # an isolated source runs: nothing joins it
        self._turn_start = 0.0
        self._wake = asyncio.Event()
        self._poked = threading.Event()  # a call was cancelled: the compute thread returns to the loop
        metrics.QUEUE_CAPACITY.labels(name).set(max_queue)

    @property
    def max_queue(self) -> int:
        return self.admission.capacity

    @max_queue.setter
    def max_queue(self, value: int) -> None:
        self.admission.capacity = value

    @property
    def reserved(self) -> int:
        """Places held by calls being tokenized (not queued yet)."""
        return self.admission.reserved

    def submit(self, items: list[Item]) -> None:
        """Queues a call's items in the places `admission.take` held for them."""
        self.admission.queued(len(items))
        self.queue.extend(items)
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self.queue))
        self._wake.set()

    def poke(self) -> None:
        self._poked.set()
        self._wake.set()

    @property
    def idle(self) -> bool:
        return not self.queue and not self.members

    async def run(self) -> None:
        while True:
            gone = {key for key, it in self.members.items() if it.future.done()}  # cancelled calls
            for key in gone:
                del self.members[key]
            newcomers = self._admit()
            if not newcomers and not self.members:  # the queue holds nothing live either
                if gone:
                    self.batch.clear()
                self._wake.clear()
                await self._wake.wait()
                continue
            self._poked.clear()
            self.turns += 1
            start = self._turn_start = time.perf_counter()
            try:
                ended, retry = await self.runtime.run(self._compute, newcomers, gone, asyncio.get_running_loop())
            except Exception as exc:  # a bug outside any one source: fail the batch, keep the loop
                log.exception("translation turn of model %s failed", self.name)
                ended, retry = [(it.search, exc) for it in self.members.values()], []
                b = self.batch
                self.batch = Seq2SeqBatch(b.session, b.io, b.device, b.max_positions)
            self._deliver(ended, retry)
            elapsed = time.perf_counter() - start
            for it in self.members.values():
                it.inference_s += elapsed

    def _admit(self) -> list[Item]:
        """Waiting items, in arrival order, while their rows fit; an isolated one only into an empty batch."""
        if self._solo and self.members:
            return []
        rows = sum(it.search.k for it in self.members.values())  # live rows (cancelled ones leave at the next turn)
        out: list[Item] = []
        self._solo, now = False, time.perf_counter()
        while self.queue:
            it = self.queue[0]
            if self._dropped(it):
                self.queue.popleft()
                continue
            if (it.isolated and (rows or out)) or ((rows or out) and rows + it.search.k > self.max_rows):
                break
            self.queue.popleft()
            out.append(it)
            rows += it.search.k
            it.queue_s = now - it.arrived
            metrics.QUEUE_DURATION.labels(self.name).observe(it.queue_s)
            self.members[id(it.search)] = it
            if it.isolated:
                self._solo = True
                break
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self.queue))
        return out

    def _dropped(self, it: Item) -> bool:
        """True (and counted) when a queued source's call went away or expired; fails an expired call."""
        expired = it.deadline is not None and time.monotonic() >= it.deadline
        if expired and not it.future.done():
            it.future.set_exception(
                DeadlineExceeded(
                    f"the call's deadline passed after {time.perf_counter() - it.arrived:.3f}s in the queue of "
                    f"{self.name!r}; allow more time or retry"
                )
            )
        if not it.future.done():
            return False
        metrics.DROPPED.labels(self.name, "expired" if expired else "cancelled").inc()
        return True

    def _compute(self, newcomers: list[Item], gone: set[int], loop) -> tuple[Ended, list[SourceSearch]]:
        """Compute thread: drop, join, then decoder steps until the loop has work (a newcomer fits,
        a call was cancelled) or SLICE_S passes. Sources that end are handed to the loop as they
        end; returns those of a failed turn and the sources to restart alone."""
        self.batch.drop(gone)
        ended = self._join(newcomers) if newcomers else []
        if ended:
            loop.call_soon_threadsafe(self._deliver, ended, [])
        metrics.BATCH_SIZE.labels(self.name).observe(self.batch.rows)
        deadline, waited = time.perf_counter() + SLICE_S, 0
        while (
            self.batch.rows
            and not self._poked.is_set()
            and not self._time_to_join(waited)
            and time.perf_counter() < deadline
        ):
            waited = waited + 1 if self.queue else 0
            try:
                t0 = time.perf_counter()
                ended = self.batch.step()
                self._inference.observe(time.perf_counter() - t0)
            except Exception as exc:
                sources = list(self.batch.sources)
                self.batch.clear()
                if len(sources) == 1:
                    return [(sources[0], exc)], []
                log.warning(
                    "translation step of model %s failed for %d sources; each restarts alone: %r",
                    self.name,
                    len(sources),
                    exc,
                )
                return [], sources
            if ended:
                loop.call_soon_threadsafe(self._deliver, ended, [])
        return [], []

    def _time_to_join(self, waited: int) -> bool:
        """Whether to go back to the loop for the head of the queue (read from the compute thread:
        a hint). Only when it fits, and once a quarter of the rows are free or it has waited
        JOIN_AFTER_STEPS steps: every join costs a thread hand-off, an encoder run and a copy of
        the batch's cache, so newcomers join in groups when the batch drains one source at a time."""
        head = self.queue[0] if self.queue else None
        if head is None or self._solo or head.isolated or self.batch.rows + head.search.k > self.max_rows:
            return False
        return self.max_rows - self.batch.rows >= max(self.max_rows // 4, head.search.k) or waited >= JOIN_AFTER_STEPS

    def _join(self, items: list[Item]) -> Ended:
        """Encodes the newcomers together (each alone if that fails) and adds their rows."""
        try:
            seqs = [it.ids for it in items]
            feeds, mask, computed = source_encoder.feeds(seqs, self.pad_id, self.pack_row_tokens, self.pack_align)
            t0 = time.perf_counter()
            cross = self.encoder.run(None, feeds)  # each (n, H, S, D), packed or not; mask (n, S)
            self._inference.observe(time.perf_counter() - t0)
            metrics.BATCH_TOKENS.labels(self.name).observe(computed)
            metrics.TOKENS.labels(self.name, "input").inc(sum(map(len, seqs)))  # read by the encoder
            metrics.PADDING_RATIO.labels(self.name).observe(computed / sum(map(len, seqs)))
            self.batch.join([it.search for it in items], cross, mask)
            return []
        except Exception as exc:
            if len(items) == 1:
                return [(items[0].search, exc)]
            return [e for it in items for e in self._join([it])]

    def _deliver(self, ended: Ended, retry: list[SourceSearch]) -> None:
        for search, exc in ended:
            it = self.members.pop(id(search), None)
            if it is None or it.future.done():
                continue
            it.inference_s += time.perf_counter() - self._turn_start
            if exc is None:
                it.future.set_result(search.result)
            else:
                it.future.set_exception(exc)
        restart = [self.members.pop(id(s)) for s in retry if id(s) in self.members]
        for it in reversed(restart):
            s = it.search
            it.search = SourceSearch(s.k, s.bos, s.eos, s.max_length, s.length_penalty, s.greedy)
            it.isolated = True
            self.queue.appendleft(it)
        if restart:
            self._wake.set()

    async def stop(self, grace_s: float) -> None:
        """Refuses new calls, lets queued and running ones finish within grace_s, fails the rest."""
        self.admission.closing = True
        deadline = time.monotonic() + grace_s
        while any(not it.future.done() for it in [*self.queue, *self.members.values()]) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for it in [*self.queue, *self.members.values()]:
            if not it.future.done():
                it.future.set_exception(Unavailable(f"model {self.name!r} shut down before the call was served"))
