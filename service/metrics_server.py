"""The /metrics HTTP server, bounded: at most MAX_CONNECTIONS threads, each read given TIMEOUT_S.

prometheus_client's `start_http_server` gives each connection a thread that waits without a timeout:
252 connections that sent half a request held 268 threads until they closed. This is the same
WSGI app (`make_wsgi_app`) on the standard library's threading WSGI server, with a socket timeout on
every connection (an idle or half-sent request is closed after TIMEOUT_S) and a cap on the
connections served at once (one more is closed at once; Prometheus scrapes one at a time). Used by
the single server (service/metrics.py) and the `--workers` supervisor alike; it defines no metric,
so the supervisor can import it without writing multiprocess files.
"""

from __future__ import annotations

import logging
import socket
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32  # served at once; Prometheus itself opens one per scrape
TIMEOUT_S = 10.0  # seconds a connection may wait for the client's next bytes


class _Handler(WSGIRequestHandler):
    timeout = TIMEOUT_S  # StreamRequestHandler sets it on the socket

    def log_message(self, format: str, *args) -> None:
        """No access log (prometheus_client's handler is silent too)."""


class BoundedServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    max_connections = MAX_CONNECTIONS

    def server_bind(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().server_bind()

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            log.debug("metrics: %d connections open; closing one more from %s", self.max_connections, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        """A client that timed out or went away: nothing to report (the default prints a traceback)."""
        log.debug("metrics: connection from %s ended early", client_address)


def start(host: str, port: int, registry: CollectorRegistry) -> BoundedServer:
    """Serves registry on host:port (0: a free port) in a daemon thread; `server.shutdown()` stops it."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(BoundedServer):
        address_family = family

    server = make_server(host, port, make_wsgi_app(registry), Server, handler_class=_Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
