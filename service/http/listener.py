"""The HTTP listening socket, which keeps working when the process runs out of file descriptors.

At RLIMIT_NOFILE (EMFILE, or the system's ENFILE) `accept()` fails while the connection stays in
the backlog, so the listener stays readable. asyncio's accept loop (CPython 3.11) then logs a
traceback per try, up to its backlog per wake-up, and schedules as many retries: measured, 12,000
tracebacks a second. `Listener` does what libuv and nginx do instead: it holds one spare
descriptor; at the limit it closes the spare, accepts the waiting connection, answers it 503 (in
the service's error shape) and closes it, then takes the spare back. The backlog drains, the
loop goes idle, a client learns at once to retry, and one WARNING says so per episode (one INFO
when connections are accepted again), each refused connection counted in
`ts_http_connections_closed_total{reason="fd_limit"}`. Should another thread take the freed
descriptor first, the error goes to asyncio once (it pauses the listener for a second) and the
rest of that wake-up reads as an empty backlog.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from typing import NoReturn

from service.http.protocol import CLOSED, refusal

log = logging.getLogger(__name__)

OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
PAUSE_S = 0.5  # after handing asyncio an EMFILE: accept() reads as "nothing waiting" this long
MESSAGE = "this server process is out of file descriptors; retry later"


def _spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class Listener(socket.socket):
    """A listening TCP socket whose accept() sheds connections instead of failing at the descriptor limit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._spare = _spare()
        self._out = False  # in an episode at the limit
        self._paused_until = 0.0

    def close(self) -> None:
        super().close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    def accept(self) -> tuple[socket.socket, object]:
        if time.monotonic() < self._paused_until:
            raise BlockingIOError(errno.EAGAIN, "listener paused at the descriptor limit")
        try:
            conn, address = super().accept()
        except OSError as e:
            if e.errno not in OUT_OF_FILES:
                raise
            self._shed(e)
        if self._out:
            self._out = False
            log.info("HTTP: file descriptors are free again; accepting connections")
        if self._spare is None:
            self._spare = _spare()
        return conn, address

    def _shed(self, error: OSError) -> NoReturn:
        """Refuses the connection waiting in the backlog with the spare descriptor; always raises."""
        if not self._out:
            self._out = True
            log.warning("HTTP: %s (%s); new connections get 503 until some close", MESSAGE, error.strerror)
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                conn, _ = super().accept()
            except OSError:
                pass  # another thread took the descriptor, or the client left
            else:
                _refuse(conn)
                self._spare = _spare()
                raise BlockingIOError(errno.EAGAIN, "connection refused at the descriptor limit") from error
        self._paused_until = time.monotonic() + PAUSE_S
        raise error


def _refuse(conn: socket.socket) -> None:
    CLOSED.labels("fd_limit").inc()
    with conn:
        conn.setblocking(False)
        with contextlib.suppress(OSError):  # the client may be gone already
            conn.send(refusal(MESSAGE))  # a few hundred bytes: the socket buffer takes them at once
