"""Continuous batching for one generation model: one asyncio task owns the running batch.

Each turn admits waiting requests while the batch has room (prefill tokens capped per turn),
prefills them together, then runs decode steps for every row, sampling over the (B, V) logits, and
drops the rows that finished, were cancelled or failed (their rows in `cache.SlotCache` freed).
Compute runs in the runtime's executor, a turn's steps back to back in one call; the loop only
moves chunks to each request's outbox. docs/design/generation-scheduling.md and
docs/design/generation.md describe the turn, the hand-offs and the failure rules (a row's own
failure fails that row; a failed graph step re-queues its rows once). Newcomers whose prompt starts
with cached tokens continue a copy of that row (prefix.py); a greedy row running alone may take
several tokens a step from a verified prompt-lookup draft (speculate.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import numpy as np

from service import metrics
from service.admission import Admission, Gate
from service.engine.graphio import GraphIO
from service.errors import ServiceError, Unavailable
from service.generation import scoring
from service.generation.cache import SlotCache
from service.generation.handle import GenerationHandle
from service.generation.output import Chunk
from service.generation.prefix import PrefixCache
from service.generation.sampler import choose_tokens
from service.generation.sequence import Sequence
from service.generation.speculate import Speculator
from service.generation.stepseries import Series, observe_many

log = logging.getLogger(__name__)

Delivery = list[tuple[Sequence, Chunk | BaseException | None]]
DECODE_SLICE_S = 0.25  # longest run of decode steps between two visits of the event loop


class Scheduler:
    def __init__(
        self,
        name: str,
        session,
        io: GraphIO,
        runtime,
        *,
        max_batch: int,
        max_queue: int,
        prefill_tokens: int,
        pad_id: int,
        device: str | None,
        context: int,
        gate: Gate | None = None,
        prefix_cache: bool = True,
        speculate: bool = False,
    ):
        self.name, self._session, self._io, self._runtime = name, session, io, runtime
        self.max_batch, self.prefill_tokens, self.pad_id = max_batch, prefill_tokens, pad_id
        self.cache = SlotCache(session, io, capacity=max_batch, max_length=context, device=device)
        self.prefix = PrefixCache(name, self.cache, prefix_cache)
        self.speculator = Speculator(name, self.cache, speculate)
        self.running: list[Sequence] = []  # row i of the cache belongs to running[i]
        self.waiting: deque[Sequence] = deque()
        self.admission = Admission(
            "generation", name, max_queue, "queued generations", gate=gate, waiting=lambda: len(self.waiting)
        )
        self.wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._computing = False  # a compute call is in the executor (its deliveries may still be queued)
        self._outbox: deque[Delivery] = deque()  # decode steps' deliveries, appended by the compute thread
        self._drain_pending = False  # a drain of the outbox is scheduled on the loop
        self._prefilling = False  # the compute call is in a prefill (a failure there is the newcomers')
        self._series = Series(name)
        metrics.QUEUE_CAPACITY.labels(name).set(max_queue)
        self._series.in_flight.set(0)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"generation-{self.name}")

    @property
    def max_queue(self) -> int:
        return self.admission.capacity

    @max_queue.setter
    def max_queue(self, value: int) -> None:
        self.admission.capacity = value

    @property
    def closing(self) -> bool:
        return self.admission.closing

    def submit(self, seq: Sequence) -> GenerationHandle:
        """Queues a generation whose place `admission.take` held (the place is the queue's from here)."""
        self.admission.queued(1)
        self.waiting.append(seq)
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self.waiting))
        self._series.in_flight.inc()
        self.wake.set()
        return GenerationHandle(seq, self.wake)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def expire(self, seq: Sequence, error: ServiceError) -> None:
        """Event loop: a generation's deadline passed. Still waiting: dropped before any compute (counted
        "expired"); running: its row is freed at the next step. Its stream raises `error`."""
        if seq.done:
            return
        if any(s is seq for s in self.waiting):
            self.waiting = deque(s for s in self.waiting if s is not seq)
            seq.left = seq.counted_out = True
            self._series.in_flight.dec()
            metrics.DROPPED.labels(self.name, "expired").inc()
            metrics.QUEUE_DEPTH.labels(self.name).set(len(self.waiting))
        seq.cancelled = True
        seq.outbox.post(error)
        self.wake.set()

    async def stop(self, grace: float) -> None:
        """Refuses new work, lets running generations finish for up to `grace` seconds, then ends them."""
        self.admission.closing = True
        deadline = time.monotonic() + grace
        while not self.idle and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for seq in [*self.waiting, *self.running]:
            if not seq.done:
                seq.cancelled = True
                seq.outbox.post(Unavailable(f"model {self.name!r} shut down before the generation finished"))
        self.wake.set()
        if self._task is not None:
            while (not self.idle or self._computing) and not self._task.done():
                await asyncio.sleep(0.005)  # rows are freed at the next step boundary, then delivered
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            if self.idle:
                self.wake.clear()
                await self.wake.wait()
            self._drop_cancelled_waiting()
            newcomers = self._admit()
            if newcomers or self.running:
                self._deliver(await self._guarded(newcomers, asyncio.get_running_loop()))
            else:
                await asyncio.sleep(0)

    async def _guarded(self, newcomers: list[Sequence], loop: asyncio.AbstractEventLoop) -> Delivery:
        """Runs one turn in the executor; when the graph step itself fails, its rows are retried once
        (module doc)."""
        self._computing = True
        try:
            return await self._runtime.run(self._turn, newcomers, loop)
        except Exception:
            log.exception("generation step failed for model %s", self.name)
            self._drain()  # the steps before the failure, in order
            newcomers = newcomers if self._prefilling else []
            joined = {id(s) for s in newcomers} & {id(s) for s in self.running}
            if newcomers and not joined:  # the prefill failed before its rows joined: the others are intact
                self.cache.keep(list(range(len(self.running))))  # drops the rows it may have appended
                involved = newcomers
            else:
                involved, self.running = self.running, []
                self.cache.reset()
            return self._retry(involved)
        finally:
            self._drain()
            self._computing = self._prefilling = False

    def _retry(self, involved: list[Sequence]) -> Delivery:
        """Event loop: rows of a failed step go back to the front of the queue once; then they fail."""
        out: Delivery = []
        for seq in reversed(involved):
            if seq.retried or seq.done:
                seq.left = True
                out.append(
                    (
                        seq,
                        None
                        if seq.done
                        else ServiceError(
                            f"generation on model {self.name!r} failed twice at token {len(seq.generated) + 1} "
                            "after a retry (a server fault, logged); retry the call later"
                        ),
                    )
                )
            else:
                seq.retried = True
                self.waiting.appendleft(seq)
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self.waiting))
        return out

    def _drop_cancelled_waiting(self) -> None:
        gone = [s for s in self.waiting if s.cancelled]
        if gone:
            self.waiting = deque(s for s in self.waiting if not s.cancelled)
            for seq in gone:
                seq.left = seq.counted_out = True
            self._series.in_flight.dec(len(gone))
            metrics.DROPPED.labels(self.name, "cancelled").inc(len(gone))
            metrics.QUEUE_DEPTH.labels(self.name).set(len(self.waiting))

    def _admit(self) -> list[Sequence]:
        """Newcomers for this turn: batch room permitting, prefill tokens (padding counted) capped.
        A row retried after a failed step is prefilled alone (if it fails again, it fails alone)."""
        chosen: list[Sequence] = []
        longest = 0
        while self.waiting and len(self.running) + len(chosen) < self.max_batch:
            nxt = self.waiting[0]
            size = len(nxt.prompt_ids) + len(nxt.generated)
            padded = (len(chosen) + 1) * max(longest, size)
            if chosen and (padded > self.prefill_tokens or nxt.retried or chosen[0].retried):
                break
            chosen.append(self.waiting.popleft())
            longest = max(longest, size)
        now = time.perf_counter()
        for seq in chosen:
            if seq.started is None:
                seq.started = now
                seq.timings.queue_ms = (now - seq.arrived) * 1e3
                metrics.QUEUE_DURATION.labels(self.name).observe(now - seq.arrived)
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self.waiting))
        return chosen

    def _turn(self, newcomers: list[Sequence], loop: asyncio.AbstractEventLoop) -> Delivery:
        """Compute thread: the newcomers' prefill, then decode steps, in one executor call (one
        thread hand-off per turn, not two): each delivery goes to the outbox as it is made."""
        if newcomers:
            self._prefilling = True
            delivery = self._prefill(newcomers)
            self._prefilling = False
            self._post(delivery, loop)
        return self._decode_slice(loop)

    def _post(self, delivery: Delivery, loop: asyncio.AbstractEventLoop) -> None:
        """Compute thread: a delivery to the outbox; a drain is scheduled unless one is pending."""
        self._outbox.append(delivery)
        if not self._drain_pending:  # else the drain already scheduled takes this one too
            self._drain_pending = True
            loop.call_soon_threadsafe(self._drain)

    def _prefill(self, newcomers: list[Sequence]) -> Delivery:
        """Compute thread: prompts of the newcomers (with their tokens so far, for a retried row) ->
        next tokens; they join the batch, and the ones already finished (EOS, one token asked,
        score only, cancelled, failed) leave it at once. Rows that asked for their prompt's scores
        get them from the same prefill's logits of every position (scoring.py)."""
        t0 = time.perf_counter()
        # Newcomers in row order (whole prefills first, then those continuing a cached prefix);
        # every: the whole prefills' logits of every position, when one of them scores its prompt.
        newcomers, logits, every = self.prefix.prefill(newcomers, self.running)
        for i, seq in enumerate(newcomers):
            if seq.params.prompt_logprobs is not None:
                seq.score_prompt(every[i])
        self._observe(t0, newcomers, len(newcomers) * max(len(s.cache_ids) for s in newcomers), prefill=True)
        # Prompt tokens read, cached ones included (usage.input_tokens; the cached: prefix metrics).
        self._series.input_tokens.inc(sum(len(s.prompt_ids) for s in newcomers if not s.retried))
        sampled = [i for i, s in enumerate(newcomers) if not s.params.score_only]
        out = self._sample(
            [newcomers[i] for i in sampled], logits if len(sampled) == len(newcomers) else logits[sampled]
        )
        out += [(s, None if s.cancelled else s.scored()) for s in newcomers if s.params.score_only]
        self.running.extend(newcomers)
        # Rows cancelled since the last step leave here too; a sequence twice in a delivery is harmless.
        return out + [(s, None) for s in self._keep(lambda s: not s.done)]

    def _decode_slice(self, loop: asyncio.AbstractEventLoop) -> Delivery:
        """Compute thread: decode steps until newcomers fit, the batch empties, closing, or the slice ends."""
        end = time.perf_counter() + DECODE_SLICE_S
        while self.running:
            self._post(self._decode(), loop)
            admissible = self.waiting and len(self.running) < self.max_batch
            if admissible or self.closing or time.perf_counter() > end:
                break
        return []

    def _decode(self) -> Delivery:
        """Compute thread: drops cancelled rows, then one new token for every running row."""
        # A row the event loop cancels from here on is caught by _sample or by the next step.
        out: Delivery = [(s, None) for s in self._keep(lambda s: not s.cancelled)]
        if not self.running:
            return out
        t0 = time.perf_counter()
        try:
            if len(self.running) == 1 and (tokens := self.speculator.step(self.running[0])) is not None:
                self._observe(t0, self.running, self.cache.tokens, prefill=False)
                out += self._accept_many(self.running[0], tokens)
                return out + [(s, None) for s in self._keep(lambda s: not s.done)]
            logits = self.cache.step([s.generated[-1] for s in self.running])  # (B, V)
            self._observe(t0, self.running, self.cache.tokens, prefill=False)
            out += self._sample(self.running, logits)
        except Exception:
            self._outbox.append(out)  # the rows that left before the failure are still counted out
            raise
        return out + [(s, None) for s in self._keep(lambda s: not s.done)]

    def _keep(self, pred) -> list[Sequence]:
        """Frees the rows of the running sequences failing `pred`, once for all; returns those sequences.

        `pred` is evaluated once per row: the event loop may cancel a sequence meanwhile."""
        verdicts = [bool(pred(s)) for s in self.running]
        if all(verdicts):
            return []
        gone = [s for s, ok in zip(self.running, verdicts) if not ok]
        for row, ok in enumerate(verdicts):  # their tokens' keys stay for later prompts, where rows are free
            if not ok:
                self.prefix.retain(row, self.running[row].cache_ids[: self.cache.lengths[row]])
        order = self.cache.keep([i for i, ok in enumerate(verdicts) if ok])  # the cache's new row order
        self.running = [self.running[i] for i in order]
        for seq in gone:
            seq.left = True
        return gone

    def _sample(self, seqs: list[Sequence], logits: np.ndarray) -> Delivery:
        """Compute thread: logits (n, V) of these rows -> their tokens (one batched pass), then each
        row's text. A row whose own work raises gets its error; the others are not touched."""
        live = [i for i, s in enumerate(seqs) if not s.cancelled]
        out: Delivery = [(s, None) for s in seqs if s.cancelled]
        tokens = choose_tokens(logits if len(live) == len(seqs) else logits[live], [seqs[i].sampling for i in live])
        scores = scoring.row_scores([s.params.logprobs for s in seqs], logits, live, tokens)
        now = time.perf_counter()
        first: list[float] = []  # rows' first tokens
        since: dict[float, int] = {}  # previous token time -> rows (one step's rows share it)
        for i, token in zip(live, tokens):
            seq = seqs[i]
            try:
                if isinstance(token, Exception):
                    raise seq.sampling_failed(token) from token
                chunk = seq.accept(token, scores.get(i))
            except Exception as exc:
                out.append((seq, self._row_failed(seq, exc)))
                continue
            if seq.last_token_at is None:
                seq.timings.time_to_first_token_ms = (now - seq.arrived) * 1e3
                first.append(now - seq.arrived)
            else:
                since[seq.last_token_at] = since.get(seq.last_token_at, 0) + 1
            seq.last_token_at = now
            out.append((seq, chunk))
        for value in first:
            self._series.ttft.observe(value)
        for last, count in since.items():
            observe_many(self._series.itl, now - last, count)
        return out

    def _accept_many(self, seq: Sequence, tokens: list[int]) -> Delivery:
        """Compute thread: a speculated step's tokens (speculate.py) through the row's output one by
        one, as plain steps would, until it finishes or its own work raises."""
        out: Delivery = []
        for token in tokens:
            try:
                out.append((seq, seq.accept(token)))
            except Exception as exc:
                out.append((seq, self._row_failed(seq, exc)))
                break
            if seq.done:
                break
        now = time.perf_counter()
        if seq.last_token_at is not None:  # the tokens of one pass share its time since the last token
            observe_many(self._series.itl, (now - seq.last_token_at) / len(out), len(out))
        seq.last_token_at = now
        return out

    def _row_failed(self, seq: Sequence, exc: Exception) -> ServiceError:
        """Ends one row whose own work raised; returns the error its call gets."""
        seq.cancelled = True  # it leaves at this step's _keep like a cancelled row
        if isinstance(exc, ServiceError):
            log.warning("generation on model %s: one request failed: %s", self.name, exc.message)
            return exc
        log.exception("generation on model %s: one request failed at token %d", self.name, len(seq.generated))
        return ServiceError(
            f"generation on model {self.name!r} failed while decoding token {len(seq.generated)} "
            f"of this request ({type(exc).__name__}; a server fault, logged); other requests "
            "were not affected"
        )

    def _observe(self, t0: float, seqs: list[Sequence], tokens: int, prefill: bool) -> None:
        elapsed = time.perf_counter() - t0
        for seq in seqs:
            seq.timings.inference_ms += elapsed * 1e3
        self._series.inference.observe(elapsed)
        self._series.batch.observe(len(seqs))
        self._series.batch_tokens.observe(tokens)
        if not prefill:
            self._series.decode_batch.observe(len(seqs))

    def _drain(self) -> None:
        """Event loop: delivers every step the compute thread put in the outbox so far."""
        self._drain_pending = False  # first: a step appended after this schedules a new drain
        while self._outbox:
            self._deliver(self._outbox.popleft())

    def _deliver(self, delivery: Delivery) -> None:
        """Event loop: chunks to their queues; rows that left stop counting as in flight."""
        tokens = 0
        for seq, item in delivery:
            if isinstance(item, BaseException):
                seq.cancelled = True
                seq.outbox.post(item)
            elif item is not None:
                tokens += len(item.token_ids)
                seq.outbox.post(item)
            # A row leaves once, but it may sit in two deliveries queued before the loop runs them.
            if seq.left and not seq.counted_out:
                seq.counted_out = True
                self._series.in_flight.dec()
        if tokens:
            self._series.output_tokens.inc(tokens)
