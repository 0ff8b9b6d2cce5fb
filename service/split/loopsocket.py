"""A zmq socket driven by the asyncio event loop through its file descriptor: every queued message
is handled in one wake-up, and a send never creates a future (zmq.asyncio makes one per call).

zmq's descriptor is edge-triggered and any operation on the socket, a send included, may consume
its edge, so after a wake-up and after each send the socket's ZMQ_EVENTS are read until no message
is left (zmq_getsockopt(3), ZMQ_FD).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import zmq


class LoopSocket:
    def __init__(self, socket: zmq.Socket, on_message: Callable[[list[Any]], None]):
        self.socket, self.on_message = socket, on_message
        self._loop = asyncio.get_running_loop()
        self._fd = int(socket.getsockopt(zmq.FD))
        self._loop.add_reader(self._fd, self._drain)
        self._due = True
        self._loop.call_soon(self._drain)  # what was queued before the reader was added

    def send(self, frames: list[bytes]) -> None:
        """Queues a message; dropped when it cannot be (a DEALER with no peer: the pidfds say why)."""
        with contextlib.suppress(zmq.Again):
            self.socket.send_multipart(frames, zmq.NOBLOCK)
        if not self._due:  # the send may have consumed the descriptor's edge
            self._due = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._due = False
        while not self.socket.closed and int(self.socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.on_message(frames)

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        self.socket.close(linger=0)
