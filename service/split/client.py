"""A front end's connections to the engine cores: `EngineClient` sends core calls and generations
to one engine (service/split/wire.py) and routes its batches to the futures and generations waiting
for them; `Engines` holds one client per engine of the group (`--engines`, one per device) and sends
each call to the least busy engine that is up; `RemoteGeneration` is the generation core's
`Generation` on this side of the socket (its pulls and cancels go to the engine that runs it).

The engine's pid is watched through a pidfd: when it exits, every waiting call and generation
fails with UNAVAILABLE at once, new calls are refused the same way, and Hello is repeated until
the restarted engine answers (`on_change(up)` tells the server, which turns health NOT_SERVING
meanwhile). A caller that goes away (its task cancelled) sends Cancel: the engine stops the call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from service.errors import Unavailable
from service.generation.core import join_chunks
from service.generation.handle import GenerationHandle, Outbox
from service.generation.output import Chunk
from service.split import wire
from service.split.loopsocket import LoopSocket

log = logging.getLogger(__name__)

ENGINE_DOWN = "the engine core process is not running (it is being restarted); retry shortly"
HELLO_EVERY_S = 0.1


class EngineClient:
    def __init__(
        self, endpoint: str, on_change: Callable[[bool], None] = lambda up: None, context: zmq.Context | None = None
    ):
        self._own_context = context is None
        self.context = zmq.Context() if context is None else context
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        for option in (zmq.SNDHWM, zmq.RCVHWM):  # no silent drop at a queue limit: admission bounds the calls
            socket.setsockopt(option, 0)
        socket.setsockopt(zmq.IDENTITY, f"frontend-{os.getpid()}".encode())
        socket.connect(endpoint)
        self.io = LoopSocket(socket, self._receive)
        self.on_change = on_change
        self.epoch = 0  # the serving engine's pid; 0 while there is none
        self.welcome: wire.Welcome | None = None
        self._pidfd: int | None = None
        self._ids = itertools.count(1)
        self._calls: dict[int, tuple[asyncio.Future, Any]] = {}  # id -> (its future, the result's decoder)
        self.generations: dict[int, RemoteGeneration] = {}
        self._up = asyncio.Event()
        self._greeting: asyncio.Task | None = asyncio.create_task(self._greet(), name="engine-hello")

    async def connected(self, timeout: float) -> wire.Welcome:
        """The engine's Welcome; TimeoutError when none came within `timeout` seconds."""
        await asyncio.wait_for(self._up.wait(), timeout)
        assert self.welcome is not None
        return self.welcome

    @property
    def load(self) -> int:
        """What this front end has waiting on the engine: calls unanswered and generations running."""
        return len(self._calls) + len(self.generations)

    def send(self, message: wire.ToEngine) -> None:
        self.io.send([wire.ENCODER.encode(message)])

    async def call(self, core: str, method: str, query: Any, deadline: float | None) -> Any:
        """One unary core call in the engine: its result, or the ServiceError it raised there."""
        key = (core, method)
        raw = msgspec.Raw(wire.ENCODER.encode(query))
        return await self._ask(lambda id: wire.Call(self.epoch, id, core, method, raw, deadline), wire.RESULTS[key])

    async def embed(self, model: str, encoded: list, deadline: float | None) -> wire.Embedded:
        """A tokenized embedding call (service/engine/tokenization.py `Encoded`s) queued in the engine."""
        ids, types = [e.ids for e in encoded], [e.type_ids for e in encoded]
        return await self._ask(lambda id: wire.Embed(self.epoch, id, model, ids, types, deadline), None)

    async def generate(self, queries: list, deadline: float | None) -> list[RemoteGeneration]:
        started = await self._ask(lambda id: wire.Generate(self.epoch, id, queries, deadline), None)
        out = []
        for gid, model, n, interval_s in started:
            out.append(RemoteGeneration(self, gid, model, n, interval_s))
            self.generations[gid] = out[-1]
        return out

    async def _ask(self, message: Callable[[int], wire.ToEngine], decoder: Any) -> Any:
        if not self.epoch:
            raise Unavailable(ENGINE_DOWN)
        id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[id] = (future, decoder)
        self.send(message(id))
        try:
            return await future
        except asyncio.CancelledError:
            self.send(wire.Cancel(id))
            raise
        finally:
            self._calls.pop(id, None)

    def _receive(self, frames: list) -> None:
        try:
            message = wire.TO_FRONTEND.decode(frames[0].buffer)
        except Exception:
            log.exception("undecodable message from the engine; dropped")
            return
        if isinstance(message, wire.Welcome):
            self._on_welcome(message)
        else:
            self._on_batch(message)

    def _on_batch(self, batch: wire.Batch) -> None:
        for result in batch.results:
            entry = self._calls.get(result.id)
            if entry is not None and not entry[0].done():
                entry[0].set_result(entry[1].decode(result.value))
        for embedded in batch.embedded:
            entry = self._calls.get(embedded.id)
            if entry is not None and not entry[0].done():
                entry[0].set_result(embedded)
        for started in batch.started:
            entry = self._calls.get(started.id)
            if entry is not None and not entry[0].done():
                entry[0].set_result(started.generations)
            else:  # its caller went away meanwhile: nobody will read these
                for gid, *_ in started.generations:
                    self.send(wire.Cancel(gid))
        for failure in batch.failures:
            error = wire.error_of(failure.code, failure.message)
            if failure.id < 0:  # a generation's (their ids are negative)
                generation = self.generations.pop(failure.id, None)
                if generation is not None:
                    generation.fail(error)
            elif failure.id in self._calls:
                future, _ = self._calls[failure.id]
                if not future.done():
                    future.set_exception(error)
        for gid, chunk in batch.chunks:
            generation = self.generations.get(gid)
            if generation is not None:
                generation.post(chunk)
        for gid, chunks in batch.collected:
            generation = self.generations.pop(gid, None)
            if generation is not None:
                generation.collected(chunks)

    def _on_welcome(self, welcome: wire.Welcome) -> None:
        if welcome.pid == self.epoch:
            return  # the answer to a repeated Hello
        self.welcome, self.epoch = welcome, welcome.pid
        try:
            self._pidfd = os.pidfd_open(welcome.pid)
        except ProcessLookupError:
            self._engine_gone()
            return
        asyncio.get_running_loop().add_reader(self._pidfd, self._engine_gone)
        if self._greeting is not None:
            self._greeting.cancel()
            self._greeting = None
        self._up.set()
        log.info("engine core pid %d serves %d model(s)", welcome.pid, len(welcome.models))
        self.on_change(True)

    async def _greet(self) -> None:
        """Hello until an engine answers (it may be starting, or restarting)."""
        while True:
            self.send(wire.Hello(os.getpid()))
            await asyncio.sleep(HELLO_EVERY_S)

    def _engine_gone(self) -> None:
        """The engine exited: everything waiting on it fails now; Hello until its successor answers."""
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        log.error("engine core pid %d exited; answering UNAVAILABLE until it is back", self.epoch)
        self.epoch = 0
        self._up.clear()
        for future, _ in list(self._calls.values()):
            if not future.done():
                future.set_exception(Unavailable(ENGINE_DOWN))
        for generation in list(self.generations.values()):
            generation.fail(Unavailable(ENGINE_DOWN))
        self.generations.clear()
        self._greeting = asyncio.create_task(self._greet(), name="engine-hello")
        self.on_change(False)

    def close(self) -> None:
        if self._greeting is not None:
            self._greeting.cancel()
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
        self.io.close()
        if self._own_context:
            self.context.term()


class Engines:
    """Every engine core of the group, one client each: a call goes to the engine that is up with
    the least waiting on it from this front end (ties in turn), so calls and streams spread over the
    devices; an engine that exits fails only what it held (UNAVAILABLE) while the others serve on.
    `on_change(up)` tells the server when the first engine came up or the last one went away."""

    def __init__(self, endpoints: tuple[str, ...] | list[str], on_change: Callable[[bool], None] = lambda up: None):
        if not endpoints:
            raise ValueError("no engine endpoint")
        self.on_change = on_change
        self.context = zmq.Context()
        self.clients = [EngineClient(e, self._changed, self.context) for e in endpoints]
        self._turn = itertools.count()
        self._up = False

    async def connected(self, timeout: float) -> wire.Welcome:
        """The first engine's Welcome (every engine serves the same models from the same settings);
        TimeoutError when none came within `timeout` seconds."""
        waits = [asyncio.ensure_future(c.connected(timeout)) for c in self.clients]
        try:
            for first in asyncio.as_completed(waits):
                try:
                    welcome = await first
                except TimeoutError:
                    continue
                self._up = True
                return welcome
            raise TimeoutError
        finally:
            for w in waits:
                w.cancel()

    def pick(self) -> EngineClient:
        """The engine to send a new call to; UNAVAILABLE when none is up."""
        up = [c for c in self.clients if c.epoch]
        if not up:
            raise Unavailable(ENGINE_DOWN)
        if len(up) == 1:
            return up[0]
        start = next(self._turn) % len(up)
        turned = up[start:] + up[:start]
        return min(turned, key=lambda c: c.load)

    async def call(self, core: str, method: str, query: Any, deadline: float | None) -> Any:
        return await self.pick().call(core, method, query, deadline)

    async def embed(self, model: str, encoded: list, deadline: float | None) -> wire.Embedded:
        return await self.pick().embed(model, encoded, deadline)

    async def generate(self, queries: list, deadline: float | None) -> list[RemoteGeneration]:
        return await self.pick().generate(queries, deadline)

    def _changed(self, _up: bool) -> None:
        up = any(c.epoch for c in self.clients)
        if up != self._up:
            self._up = up
            self.on_change(up)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.context.term()


class _Inbox(GenerationHandle):
    """GenerationHandle's taking of chunks, over chunks posted from the engine's batches."""

    def __init__(self) -> None:  # no Sequence here: the row lives in the engine
        self._box, self._ended, self._taken = Outbox(), False, 0


class RemoteGeneration:
    """One generation running in the engine, as service/generation/core.py `Generation` offers it:
    iterate it (chunks sent as the engine's steps post them) or `collect()` it (every choice, sent
    once at its end); which one is asked of the engine at the first use (Pull)."""

    def __init__(self, client: EngineClient, gid: int, model: str, n: int, interval_s: float):
        self.client, self.id, self.model, self.n, self.interval_s = client, gid, model, n, interval_s
        self._inbox = _Inbox()
        self._pulled = self._ended = False
        self._collected: asyncio.Future | None = None

    def _pull(self, collect: bool) -> None:
        if not self._pulled:
            self._pulled = True
            self.client.send(wire.Pull(self.id, collect))

    def __aiter__(self) -> RemoteGeneration:
        return self

    async def __anext__(self) -> Chunk:
        self._pull(False)
        return await self._inbox.__anext__()

    def ready(self) -> list[Chunk]:
        return self._inbox.ready()

    async def batches(self):
        async for chunk in self:
            yield join_chunks([chunk, *self.ready()])

    async def collect(self) -> list[Chunk]:
        self._collected = asyncio.get_running_loop().create_future()
        self._pull(True)
        return await self._collected

    def post(self, chunk: Chunk) -> None:
        self._inbox._box.post(chunk)
        if chunk.finish_reason is not None:
            self._end()

    def collected(self, chunks: list[Chunk]) -> None:
        self._end()
        if self._collected is not None and not self._collected.done():
            self._collected.set_result(chunks)

    def fail(self, error: BaseException) -> None:
        self._end()
        self._inbox._box.post(error)
        if self._collected is not None and not self._collected.done():
            self._collected.set_exception(error)

    def _end(self) -> None:
        self._ended = True
        self.client.generations.pop(self.id, None)

    def cancel(self) -> None:
        """Ends the generation (idempotent): the engine frees its rows at its next step."""
        if not self._ended:
            self._end()
            self.client.send(wire.Cancel(self.id))
