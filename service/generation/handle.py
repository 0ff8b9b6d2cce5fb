"""The caller's side of one generation: the `Outbox` the scheduler posts chunks to (event loop), and
the `GenerationHandle` that takes them.

The hand-off costs one list append per chunk and at most one wake-up of the caller per decode
step: the caller's future is resolved only when it is waiting, and a caller that reads the whole
generation (unary Generate) is woken once, when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from service.generation.output import Chunk

if TYPE_CHECKING:
    from service.generation.sequence import Sequence


class Outbox:
    """Chunks and at most one error posted for the caller, not yet taken (event loop only)."""

    def __init__(self) -> None:
        self.items: list[Chunk | BaseException] = []
        self.waiter: asyncio.Future | None = None  # the caller's, while it waits
        self.wake_at_end = False  # the caller waits for the whole generation: wake it only at its end
        self.listener: Callable[[], None] | None = None  # told of every post (`Generation.listen`)

    def post(self, item: Chunk | BaseException) -> None:
        """A chunk (or the call's error) for the caller; wakes it if it waits."""
        self.items.append(item)
        if self.listener is not None:
            self.listener()
        waiter = self.waiter
        wake = not self.wake_at_end or isinstance(item, BaseException) or item.finish_reason is not None
        if waiter is not None and not waiter.done() and wake:
            waiter.set_result(None)


class GenerationHandle:
    """The caller's side: iterate the chunks; `cancel()` (idempotent) frees the row within one step.

    `__anext__` returns the next chunk, waiting when none is there; `ready()` takes those already
    posted; `collect()` waits for the whole generation. An error is raised once the chunks posted
    before it were taken."""

    def __init__(self, seq: Sequence, wake: asyncio.Event):
        self._seq, self._box, self._wake = seq, seq.outbox, wake
        self._ended = False
        self._taken = 0  # outbox items already returned

    def __aiter__(self) -> GenerationHandle:
        return self

    @property
    def sequence(self) -> Sequence:
        return self._seq

    async def __anext__(self) -> Chunk:
        if self._ended:
            raise StopAsyncIteration
        box = self._box
        if self._taken == len(box.items):
            await self._wait()
        item = box.items[self._taken]
        self._taken += 1
        self._trim()
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        self._ended = item.finish_reason is not None
        return item

    def ready(self) -> list[Chunk]:
        """The chunks already posted, without waiting (up to the last one, or up to an error, which
        the next iteration raises). A stream that fell behind the decoder sends them as one message."""
        out: list[Chunk] = []
        items = self._box.items
        while not self._ended and self._taken < len(items):
            item = items[self._taken]
            if isinstance(item, BaseException):
                break
            self._taken += 1
            out.append(item)
            self._ended = item.finish_reason is not None
        self._trim()
        return out

    def listen(self, on_post: Callable[[], None]) -> None:
        """Calls `on_post()` after each post to this generation's outbox (a reader that `take`s)."""
        self._box.listener = on_post

    def take(self) -> tuple[list[Chunk], BaseException | None]:
        """`ready()`, and the error posted after those chunks, if one was (the generation ends with it)."""
        out = self.ready()
        items = self._box.items
        if self._ended or self._taken == len(items):
            return out, None
        error = items[self._taken]  # ready() stops only at an error
        assert isinstance(error, BaseException)
        self._taken += 1
        self._ended = True
        self._trim()
        return out, error

    @property
    def ended(self) -> bool:
        """Its last chunk or its error was taken."""
        return self._ended

    async def collect(self) -> list[Chunk]:
        """Every chunk of the generation, waking once at its end (not at every step); raises its error."""
        self._box.wake_at_end = True
        chunks: list[Chunk] = []
        async for chunk in self:
            chunks.append(chunk)
            chunks.extend(self.ready())
            if chunks and chunks[-1].finish_reason is not None:
                break
        return chunks

    async def _wait(self) -> None:
        box = self._box
        box.waiter = asyncio.get_running_loop().create_future()
        try:
            await box.waiter
        finally:
            box.waiter = None

    def _trim(self) -> None:
        if self._taken == len(self._box.items):
            self._box.items.clear()
            self._taken = 0

    def cancel(self) -> None:
        if not self._seq.done:
            self._seq.cancelled = True
            self._wake.set()
