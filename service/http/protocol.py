"""uvicorn's h11 protocol with what uvicorn lacks at the door: header and write timeouts and a connection cap.

uvicorn bounds an idle kept-alive connection but not how long a client takes to send a request's
headers, nor how long a response waits on a client that does not read it, and its
`limit_concurrency` answers 503 yet keeps every connection open: slow clients could hold file
descriptors and answers in memory without a token. `guarded(header_timeout, max_connections,
write_timeout)` is the protocol class given to `uvicorn.Config(http=...)`: a connection is closed
unless the next request's headers are all in within `header_timeout` of it opening or of the last
response (the body has its own limit, service/http/body.py); a connection whose send buffer stays
over the transport's high-water mark (asyncio paused writing) for `write_timeout` is aborted,
which frees the answer it held; a connection beyond `max_connections` gets a 503 in the service's
error shape and is closed before a byte is read. Each is counted in
`ts_http_connections_closed_total{reason}`. With TLS the header timer starts after the handshake.
"""

from __future__ import annotations

import asyncio
import json

import grpc
from prometheus_client import Counter
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.http.errors import error_body

CLOSED = Counter("ts_http_connections_closed", "HTTP connections the server closed to protect itself", ["reason"])


def guarded(header_timeout: float, max_connections: int, write_timeout: float = 30.0) -> type[H11Protocol]:
    """The protocol class for uvicorn.Config(http=...) with these limits."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout": header_timeout, "max_connections": max_connections, "write_timeout": write_timeout},
    )


class GuardedH11Protocol(H11Protocol):
    header_timeout = 10.0
    max_connections = 1024
    write_timeout = 30.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            self._refused = True
            CLOSED.labels("connection_limit").inc()
            transport.write(refusal(over_limit(self.max_connections)))
            transport.close()
            return
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._write_resumed()
        if not self._refused:  # a refused connection never set up uvicorn's state
            super().connection_lost(exc)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # first: a pipelined request that super() handles disarms it
        super().on_response_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_late)

    def resume_writing(self) -> None:
        self._write_resumed()
        super().resume_writing()

    def _write_resumed(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_late(self) -> None:
        self._write_timer = None
        CLOSED.labels("write_timeout").inc()
        self.transport.abort()  # close() would wait for the buffer to drain; abort drops it

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            CLOSED.labels("header_timeout").inc()
            self.transport.close()


def over_limit(limit: int) -> str:
    return (
        f"this server already holds {limit} HTTP connections (http_max_connections); retry later, or reuse "
        "a kept-alive connection"
    )


def refusal(message: str) -> bytes:
    """A whole 503 response in the service's error shape, for a connection closed before a byte is read."""
    body = json.dumps(error_body(grpc.StatusCode.UNAVAILABLE, message)).encode()
    head = (
        f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body
