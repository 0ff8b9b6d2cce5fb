"""uvicorn inside the service's event loop: bind, serve as a task, drain with the gRPC server.

uvicorn speaks HTTP/1.1 through service/http/protocol.py's h11 protocol, which adds a header
timeout and a connection cap, on a service/http/listener.py socket, which refuses connections
instead of flooding the log when the process is out of file descriptors. The socket is bound
here, not by uvicorn, so that a taken port fails the start with a clear OSError, port 0's choice
is known (and logged) at once, and worker processes can share one port with SO_REUSEPORT
(service/supervisor.py reserves it, each worker binds it). uvicorn's own signal handling is off:
service/server.py owns SIGTERM and calls `stop(grace)`, which
1. keeps the listener open while in-flight calls finish, so that new calls get 503 (the registry
   is draining) rather than a refused connection, for at most `grace` seconds; then
2. tells uvicorn to exit: it closes the listener and idle keep-alive connections, and cancels what
   still runs after a last second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from service.http.listener import Listener
from service.http.protocol import guarded
from service.inflight import Inflight

log = logging.getLogger(__name__)

LAST_SECONDS = 1  # after the grace: what uvicorn still gives connections before it cancels them


class _Uvicorn(uvicorn.Server):
    def capture_signals(self):
        return contextlib.nullcontext()  # the service's own handlers stay (service/server.py)


def bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A bound TCP socket on host:port (0: a free port); reuse_port joins a worker group's port."""
    family, _, _, _, address = socket.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and without it
    # every small response waits ~40 ms (Nagle against the client's delayed ACK; measured).
    sock = Listener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # sheds connections at the fd limit
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart rebinds past TIME_WAIT
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot bind HTTP to {host}:{port} ({e})") from e
    return sock


class HttpServer:
    """A started uvicorn server; `port` is the one bound."""

    def __init__(
        self,
        app,
        sock: socket.socket,
        inflight: Inflight,
        ssl: dict | None = None,
        header_timeout: float = 10.0,
        max_connections: int = 1024,
        write_timeout: float = 30.0,
    ):
        self.port = sock.getsockname()[1]
        self._inflight = inflight
        self.scheme = "https" if ssl else "http"
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=LAST_SECONDS,
            http=guarded(header_timeout, max_connections, write_timeout),
            **(ssl or {}),
        )
        self._server = _Uvicorn(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http")

    @classmethod
    async def start(
        cls,
        app,
        host: str,
        port: int,
        reuse_port: bool = False,
        ssl: dict | None = None,
        header_timeout: float = 10.0,
        max_connections: int = 1024,
        write_timeout: float = 30.0,
    ) -> HttpServer:
        """ssl: uvicorn's TLS options (service/http/security.py), None for plaintext; header_timeout,
        max_connections and write_timeout: the door's limits (service/http/protocol.py)."""
        sock = bind(host, port, reuse_port)
        server = cls(app, sock, app.state.inflight, ssl, header_timeout, max_connections, write_timeout)
        while not server._server.started:  # startup is one create_server call: a few loop turns
            if server._task.done():
                server._task.result()  # raises what stopped it
                raise OSError("HTTP server stopped during startup")
            await asyncio.sleep(0.01)
        log.info("HTTP listening on %s://%s:%d", server.scheme, host, server.port)
        return server

    async def stop(self, grace: float) -> None:
        """Waits up to grace seconds for in-flight calls (new ones get 503 meanwhile), then exits."""
        if self._inflight.count and not await self._inflight.wait_idle(grace):
            log.warning("HTTP: %d call(s) still running after %.1fs grace; closing", self._inflight.count, grace)
        self._server.should_exit = True
        await self._task
