"""Calls in flight, which the graceful drain waits on, for gRPC and HTTP alike.

On SIGTERM both doors refuse new calls (UNAVAILABLE / 503) while their listeners stay open, the
drain waits for the calls already running (at most `grace` seconds), and only then are the
servers stopped (service/server.py): stopping grpc's server at once closes the listener and sends
GOAWAY, and a call racing with that could wait for its whole deadline instead of getting
UNAVAILABLE. `TrackCalls` counts gRPC calls from their handler's start to its end, health and
reflection excepted (a health Watch stream never ends on its own). Being the one interceptor
every call passes, it also gives every method the deserializer that refuses undecodable request
bytes (service/undecodable.py); each method's wrapping is built once and cached.
"""

from __future__ import annotations

import asyncio
import inspect

import grpc

from service import undecodable

UNCOUNTED_PREFIXES = ("/grpc.health.", "/grpc.reflection.")


class Inflight:
    """Calls between arrival and their end; `wait_idle` returns once none is left."""

    def __init__(self):
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False


class TrackCalls(grpc.aio.ServerInterceptor):
    """Counts every gRPC call but health and reflection in `inflight` while its handler runs, and in
    `accepted` (a worker's `ts_worker_rpcs_total` child; None in a single process) as it starts."""

    def __init__(self, inflight: Inflight, accepted=None):
        self.inflight, self.accepted = inflight, accepted
        self._wrapped: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            guarded = undecodable.guard(handler, method)
            wrapped = guarded if method.startswith(UNCOUNTED_PREFIXES) else self._wrap(guarded)
            self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kind = (
            ("stream" if handler.request_streaming else "unary")
            + "_"
            + ("stream" if handler.response_streaming else "unary")
        )
        behaviour = getattr(handler, kind)
        inflight, accepted = self.inflight, self.accepted
        if inspect.isasyncgenfunction(behaviour):

            async def streamed(request, context):
                if accepted is not None:
                    accepted.inc()
                inflight.enter()
                try:
                    async for response in behaviour(request, context):
                        yield response
                finally:
                    inflight.leave()

            return handler._replace(**{kind: streamed})

        async def counted(request, context):
            if accepted is not None:
                accepted.inc()
            inflight.enter()
            try:
                return await behaviour(request, context)
            finally:
                inflight.leave()

        return handler._replace(**{kind: counted})
