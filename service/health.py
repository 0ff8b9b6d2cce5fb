"""gRPC health (grpc.health.v1.Health) that no client can hold: status changes never wait on a writer.

grpc_health's async servicer holds one condition per service while a `Watch` stream writes, and
`set` / `enter_graceful_shutdown` take that condition first: a client that opens a Watch with a
flow-control window of 0 and never reads parks the write, and with it every status change, the
drain included (health stays SERVING while every call gets UNAVAILABLE). Here a status change
writes the table and wakes the watchers (an `asyncio.Event` swapped for a fresh one), taking no
lock; each Watch writes on its own. A Watch whose client takes no answer holds one pending message
and nothing else: changes meanwhile coalesce (only the latest status is written once the write
completes), the streams of one connection are bounded (`grpc.max_concurrent_streams`, service/server.py),
and the stream ends when its connection closes or at the drain's end (grpc's stop cancels it). The protocol
is grpc_health's: Check answers NOT_FOUND for an unknown service, Watch sends SERVICE_UNKNOWN and
waits, and only status changes are written (the last one wins when several come at once).
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Statuses by service name ("" is the server's); `set` and `enter_graceful_shutdown` never block."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {"": NOT_SERVING}
        self._changed = asyncio.Event()  # set (and replaced) on every change
        self._shutting_down = False

    async def Check(self, request: health_pb2.HealthCheckRequest, context) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        last = None
        while True:
            changed = self._changed  # taken before the status is read: no change slips in between
            status = self._status.get(request.service, UNKNOWN)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            await changed.wait()

    def set(self, service: str, status: int) -> None:
        """Sets a service's status and wakes its watchers; ignored once the shutdown began."""
        if not self._shutting_down:
            self._set(service, status)

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING for good: later `set` calls are ignored."""
        if self._shutting_down:
            return
        self._shutting_down = True
        for service in list(self._status):
            self._set(service, NOT_SERVING)

    def _set(self, service: str, status: int) -> None:
        self._status[service] = status
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
