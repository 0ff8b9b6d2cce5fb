"""Admission: the one check every call passes before any work is spent on it.

`Gate` is the server's: open until the drain starts (SIGTERM), then every new call gets UNAVAILABLE;
a call admitted before (`Gate.enter`: a stream, a call that queues several times) goes on.
`Admission` is one model's (or one compute pool's): `take(n)` refuses with UNAVAILABLE while the
server drains or the model stops, with INVALID_ARGUMENT when `n` alone passes `capacity` (no wait
would help: split the call), and with RESOURCE_EXHAUSTED when the places already held plus `n` would
pass it; else it holds `n` places until `release(n)` (the call failed before
queueing, or finished computing) or `queued(n)` (its items are in the queue now, which counts them
through `waiting`). Every kind admits through it: the encoder batcher (embedding, fill-mask), both
decoder schedulers, and the attention pool. (TEI `core/src/infer.rs`: a permit first, else Overloaded.)
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from service.errors import InvalidArgument, ResourceExhausted, Unavailable

log = logging.getLogger(__name__)

_ENTERED: contextvars.ContextVar[bool] = contextvars.ContextVar("ts_entered", default=False)


class Gate:
    """Open until the server drains; shared by every model of the process (service/runtime.py)."""

    def __init__(self) -> None:
        self.draining = False

    def check(self) -> None:
        """UNAVAILABLE once draining, unless the current call entered before (its task's context)."""
        if self.draining and not _ENTERED.get():
            raise Unavailable("the server is shutting down; retry on another replica")

    def enter(self) -> None:
        """check(), then lets the current call (and the tasks it starts) through the drain: an open
        stream's later messages, the texts of one KServe call, are in-flight work, not new calls."""
        self.check()
        _ENTERED.set(True)


class Admission:
    """Places of one model's queue: held = waiting() + taken-not-yet-queued, never above capacity."""

    def __init__(
        self,
        kind: str,
        model: str,
        capacity: int,
        unit: str,
        *,
        gate: Gate | None = None,
        waiting: Callable[[], int] | None = None,
    ):
        """kind, model and unit name the queue in messages ("fill-mask", "queued inputs"; model "": a pool
        shared by every model); `waiting` counts the items already queued, which hold their places
        until they leave the queue (None: a compute pool, nothing waits)."""
        self.kind, self.model, self.capacity, self.unit = kind, model, capacity, unit
        self.gate = gate or Gate()
        self.queue = waiting is not None  # places of a queue (else of a compute pool: none wait)
        self.waiting = waiting or (lambda: 0)
        self.reserved = 0  # places taken by admitted calls whose items are not queued yet
        self.closing = False  # the model is stopping

    def check(self, n: int = 1) -> None:
        """Raises what `take(n)` would raise, holding nothing."""
        self.gate.check()
        if self.closing:
            raise Unavailable(f"model {self.model!r} is shutting down; retry on another replica")
        queue = f"{self.kind} queue of model {self.model!r}" if self.model else f"{self.kind} queue"
        if n > self.capacity:  # no wait would let it in
            raise InvalidArgument(
                f"this call needs {n} places; the {queue} holds {self.capacity} {self.unit}: split the call"
            )
        waiting = self.waiting()
        held = waiting + self.reserved
        if held + n > self.capacity:
            detail = f": {waiting} waiting, {self.reserved} being tokenized" if self.queue else ""
            raise ResourceExhausted(
                f"{queue} is full ({held} of {self.capacity} {self.unit}{detail}; this call adds "
                f"{n}); retry with backoff"
            )

    def take(self, n: int = 1) -> None:
        """Holds n places, or raises Unavailable / ResourceExhausted at once."""
        self.check(n)
        self.reserved += n

    def release(self, n: int = 1) -> None:
        """Gives back places that will not be queued (the call failed first, or finished computing)."""
        self._give_back(n, "released")

    def queued(self, n: int) -> None:
        """The n places' items are in the queue now: `waiting` counts them from here on."""
        self._give_back(n, "queued")

    def _give_back(self, n: int, how: str) -> None:
        """reserved -= n, never below 0: more places given back than taken is a bug, logged, not a
        silently larger queue."""
        if n > self.reserved:
            log.error(
                "%s admission of model %r: %d places %s but only %d held; counting 0 held (a bug: places "
                "given back twice)",
                self.kind,
                self.model,
                n,
                how,
                self.reserved,
            )
        self.reserved = max(0, self.reserved - n)

    @contextmanager
    def holding(self, n: int = 1) -> Iterator[None]:
        """take(n) for the duration of a block (a compute pool's cap)."""
        self.take(n)
        try:
            yield
        finally:
            self.release(n)
