"""The engine core process of `--frontends N`: every model, batcher and scheduler of one device,
serving its front ends (service/split/frontend.py) over a pyzmq ROUTER socket.

It runs the real cores (service/cores.py) on what the front ends send (service/split/wire.py):
a unary call's answer, a generation's chunks as the scheduler posts them (`Generation.listen` and
`take()`: one joined chunk per generation per step, no task per generation) or every choice at its
end; what became ready in one loop turn goes to each front end as one `Batch`. Each front end says
its pid; the engine watches it through a pidfd, and when it exits its calls are cancelled and its
rows freed at the next step.
SIGTERM drains: new calls UNAVAILABLE, those in flight finish (within the grace period), exit 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import os
from typing import Any

import msgspec
import zmq

from service.cores import BACKENDS, Cores
from service.engine.tokenization import Encoded
from service.errors import ServiceError, Unavailable
from service.generation.constraint import Structure
from service.generation.core import Generation
from service.generation.query import GenerateQuery
from service.registry import ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.split import wire
from service.split.load import EngineLoad, served_models
from service.split.loopsocket import LoopSocket

log = logging.getLogger(__name__)

RESTARTED = "the engine restarted and lost this call; retry it"


class Peer:
    """One front end: its calls (id -> task), its generations and what is ready for it this turn."""

    def __init__(self, identity: bytes, pid: int):
        self.identity, self.pid = identity, pid
        self.pidfd = os.pidfd_open(pid)
        # ("call" | "pull", id) -> its task, or an Embed's batcher future (cancelling either stops it)
        self.tasks: dict[tuple[str, int], asyncio.Future] = {}
        self.generations: dict[int, Generation] = {}
        self.posted: set[int] = set()  # streamed generations with chunks posted since the last flush
        self.batch: wire.Batch | None = None
        self.gone = False

    def idle(self) -> bool:
        return not self.tasks and not self.generations


class Engine:
    """The engine's side of the socket: `_receive` handles each message, `_flush` sends each front
    end's batch once per loop turn."""

    def __init__(self, cores: Cores, settings: Settings, socket: zmq.Socket):
        self.cores, self.settings = cores, settings
        self.io = LoopSocket(socket, self._receive)
        self.pid = os.getpid()
        self.peers: dict[bytes, Peer] = {}
        self._ids = itertools.count(-1, -1)  # generation ids: negative (a call's are positive), unique here
        self._flush_due = False

    def _receive(self, frames: list) -> None:
        identity, payload = frames
        try:
            message = wire.TO_ENGINE.decode(payload.buffer)
        except Exception:
            log.exception("undecodable message from a front end; dropped")
            return
        self._handle(bytes(identity.buffer), message)

    def _handle(self, identity: bytes, message: wire.ToEngine) -> None:
        if isinstance(message, wire.Hello):
            self._welcome(identity, message.pid)
            return
        peer = self.peers.get(identity)
        if peer is None:
            return  # a front end that never said hello to this engine: its Hello comes next
        if isinstance(message, wire.Call | wire.Embed | wire.Generate) and message.epoch != self.pid:
            self._fail(peer, message.id, Unavailable(RESTARTED))
        elif isinstance(message, wire.Embed):
            self._embed(peer, message)
        elif isinstance(message, wire.Call):
            peer.tasks["call", message.id] = self._task(peer, ("call", message.id), self._call(peer, message))
        elif isinstance(message, wire.Generate):
            peer.tasks["call", message.id] = self._task(peer, ("call", message.id), self._generate(peer, message))
        elif isinstance(message, wire.Pull):
            generation = peer.generations.get(message.id)
            if generation is not None and message.collect:
                pull = self._collect(peer, message.id, generation)
                peer.tasks["pull", message.id] = self._task(peer, ("pull", message.id), pull)
            elif generation is not None:
                generation.listen(functools.partial(self._posted, peer, message.id))
                self._posted(peer, message.id)  # what was posted before the pull
        elif isinstance(message, wire.Cancel):
            self._cancel(peer, message.id)

    def _welcome(self, identity: bytes, pid: int) -> None:
        old = self.peers.get(identity)
        if old is None or old.pid != pid:
            if old is not None:
                self._forget(old)
            peer = self.peers[identity] = Peer(identity, pid)
            asyncio.get_running_loop().add_reader(peer.pidfd, self._forget, peer)
            log.info("front end pid %d connected", pid)
        welcome = wire.Welcome(self.pid, served_models(self.cores.registry), dict(self.cores.registry.defaults))
        self.io.send([identity, wire.ENCODER.encode(welcome)])

    def _forget(self, peer: Peer) -> None:
        """The front end exited (its pidfd turned readable): its calls end, its rows are freed."""
        if peer.gone:
            return
        peer.gone = True
        asyncio.get_running_loop().remove_reader(peer.pidfd)
        os.close(peer.pidfd)
        if self.peers.get(peer.identity) is peer:
            del self.peers[peer.identity]
        log.log(
            logging.WARNING if peer.tasks or peer.generations else logging.INFO,
            "front end pid %d exited; cancelling its %d call(s), %d generation(s)",
            peer.pid,
            len(peer.tasks),
            len(peer.generations),
        )
        for generation in peer.generations.values():
            generation.cancel()
        peer.generations.clear()
        for task in list(peer.tasks.values()):
            task.cancel()

    def _cancel(self, peer: Peer, id: int) -> None:
        generation = peer.generations.pop(id, None)
        if generation is not None:
            generation.cancel()
        for key in (("call", id), ("pull", id)):
            task = peer.tasks.get(key)
            if task is not None:
                task.cancel()

    def _task(self, peer: Peer, key: tuple[str, int], work: Any) -> asyncio.Task:
        task = asyncio.create_task(work)
        task.add_done_callback(lambda t: peer.tasks.pop(key, None) if peer.tasks.get(key) is t else None)
        return task

    async def _call(self, peer: Peer, call: wire.Call) -> None:
        try:
            key = (call.core, call.method)
            query = wire.QUERIES[key].decode(call.query)
            value = await getattr(getattr(self.cores, call.core), call.method)(query, call.deadline)
        except BaseException as e:
            self._fail(peer, call.id, e)
            if not isinstance(e, Exception):
                raise
            return
        self._batch(peer).results.append(wire.Result(call.id, msgspec.Raw(wire.ENCODER.encode(value))))

    def _embed(self, peer: Peer, call: wire.Embed) -> None:
        """Queues a tokenized embedding call in its model's batcher, from this loop turn: the
        batcher's future answers it (`_embedded`), and cancelling that future drops its inputs."""
        try:
            model = self.cores.registry.get("embedding", call.model)
            encoded = [Encoded(ids, types) for ids, types in zip(call.ids, call.type_ids, strict=True)]
            model.batcher.admission.take(len(encoded))  # type: ignore[attr-defined]
            future = model.batcher.enqueue(encoded, call.deadline)  # type: ignore[attr-defined]
        except Exception as e:
            self._fail(peer, call.id, e)
            return
        key = ("call", call.id)
        peer.tasks[key] = future
        future.add_done_callback(functools.partial(self._embedded, peer, key))

    def _embedded(self, peer: Peer, key: tuple[str, int], future: asyncio.Future) -> None:
        if peer.tasks.get(key) is future:
            del peer.tasks[key]
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            self._fail(peer, key[1], error)
            return
        o = future.result()
        self._batch(peer).embedded.append(wire.Embedded(key[1], o.outputs, o.input_tokens, o.queue_s, o.inference_s))

    async def _generate(self, peer: Peer, call: wire.Generate) -> None:
        try:
            queries = [await self._compiled(q) for q in call.queries]
            generations = await self.cores.generation.generate_many(queries, call.deadline)
        except BaseException as e:
            self._fail(peer, call.id, e)
            if not isinstance(e, Exception):
                raise
            return
        if peer.gone:
            for g in generations:
                g.cancel()
            return
        started = []
        for g in generations:
            gid = next(self._ids)
            peer.generations[gid] = g
            started.append((gid, g.model, g.n, g.interval_s))
        self._batch(peer).started.append(wire.Started(call.id, started))

    async def _compiled(self, query: GenerateQuery) -> GenerateQuery:
        """A structured output arrives as its structure (a dict); compiled here (cached per model)."""
        spec = query.params.constraint
        if spec is None:
            return query
        model = self.cores.generation.registry.get("generation", query.model)
        compiled = await model.constraints.compile(Structure(**spec))  # type: ignore[attr-defined]
        return dataclasses.replace(query, params=dataclasses.replace(query.params, constraint=compiled))

    def _posted(self, peer: Peer, gid: int) -> None:
        """A streamed generation has a chunk (or its error): taken at this turn's flush."""
        peer.posted.add(gid)
        self._flush_soon()

    def _take_posted(self, peer: Peer) -> None:
        """Each streamed generation's chunks posted since the last flush, joined into one chunk;
        one that ended (its last chunk, or an error) is done with."""
        posted, peer.posted = peer.posted, set()
        for gid in posted:
            generation = peer.generations.get(gid)
            if generation is None:
                continue  # cancelled, or its front end went away
            chunk, error, ended = generation.take()
            if chunk is not None:
                self._batch(peer).chunks.append((gid, chunk))
            if error is not None:
                self._fail(peer, gid, error)
            if ended:
                generation.cancel()
                del peer.generations[gid]

    async def _collect(self, peer: Peer, gid: int, generation: Generation) -> None:
        try:
            chunks = await generation.collect()
            self._batch(peer).collected.append((gid, chunks))
        except Exception as e:
            self._fail(peer, gid, e)
        finally:
            generation.cancel()
            peer.generations.pop(gid, None)

    def _fail(self, peer: Peer, id: int, error: BaseException) -> None:
        if isinstance(error, ServiceError):
            failure = wire.Failure(id, error.code.name, error.message)
        elif isinstance(error, asyncio.CancelledError):
            return  # the front end cancelled it, or went away
        else:
            log.error("call %d of front end pid %d failed", id, peer.pid, exc_info=error)
            failure = wire.Failure(id, "INTERNAL", "internal error (the engine's log has the traceback)")
        self._batch(peer).failures.append(failure)

    def _batch(self, peer: Peer) -> wire.Batch:
        """The front end's batch of this loop turn; sent by one callback after every task woken now ran."""
        if peer.batch is None:
            peer.batch = wire.Batch()
        self._flush_soon()
        return peer.batch

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        for peer in self.peers.values():
            if peer.posted:
                self._take_posted(peer)
        self._flush_due = False
        for peer in self.peers.values():
            if peer.batch is not None:
                batch, peer.batch = peer.batch, None
                self.io.send([peer.identity, wire.ENCODER.encode(batch)])

    def idle(self) -> bool:
        return all(p.idle() for p in self.peers.values())


async def run_engine(settings: Settings, endpoint: str, on_ready: Any, stop: asyncio.Event, index: int) -> int:
    """Loads and warms every model, serves the front ends on `endpoint` until `stop` is set, drains;
    `index`: which of the group's engines this is (its metrics' `engine` label)."""
    runtime = Runtime(settings)
    registry = await asyncio.to_thread(ModelRegistry.load, settings, runtime, BACKENDS)
    await registry.start()
    cores = Cores.build(registry, settings, runtime)
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    for option in (zmq.SNDHWM, zmq.RCVHWM):  # no silent drop at a queue limit: admission bounds the calls
        socket.setsockopt(option, 0)
    socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted front end with the same identity takes over
    socket.bind(endpoint)
    engine = Engine(cores, settings, socket)
    load = EngineLoad(runtime, index)
    sampling = asyncio.create_task(load.run(), name="engine-load")
    log.info("engine core serving %d model(s) on %s", len(list(registry)), endpoint)
    on_ready()
    await stop.wait()
    log.info("engine draining: new calls UNAVAILABLE, %.1fs grace for those in flight", settings.grace_seconds)
    registry.draining = True
    deadline = asyncio.get_running_loop().time() + settings.grace_seconds
    while not engine.idle() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    await registry.stop()
    await asyncio.sleep(0.05)  # the last batches leave
    sampling.cancel()
    engine.io.close()
    context.term()
    await asyncio.to_thread(runtime.close)
    log.info("engine stopped")
    return 0
