"""A gRPC client connection driven frame by frame through the `h2` library, for hostile clients.

`RawGrpc(address, window=0)` opens a plaintext HTTP/2 connection with the SETTINGS a test chooses
(an initial window of 0: the server may send headers but no answer bytes), sends gRPC calls without
waiting for their answers (`call`), and reads only when asked (`pump`): a client that never reads
its answers, or never lets the server write them. Used by bench/hostile_lifecycle.py and
tests/service/test_hostile_lifecycle.py.
"""

from __future__ import annotations

import socket
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings


class RawGrpc:
    """One connection; `refused` counts streams the server reset (RST_STREAM), `ended` those it answered."""

    def __init__(self, address: str, window: int | None = None):
        host, port = address.rsplit(":", 1)
        self.authority = address
        self.sock = socket.create_connection((host, int(port)))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if window is not None:
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.refused = self.ended = 0
        self.server_settings: dict[int, int] = {}
        self.flush()

    def call(self, path: str, message: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> int:
        """Sends one unary or server-streaming call (headers and its one message); returns its stream id."""
        stream = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        self.conn.send_headers(stream, headers)
        self.conn.send_data(stream, b"\x00" + len(message).to_bytes(4, "big") + message, end_stream=True)
        return stream

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, seconds: float) -> None:
        """Reads and handles frames for `seconds` (settings acknowledged; answer bytes never acknowledged,
        so a window stays as the server left it)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except (TimeoutError, OSError):
                return
            if not data:
                return
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                return
            for event in events:
                if isinstance(event, h2.events.StreamReset):
                    self.refused += 1
                elif isinstance(event, h2.events.StreamEnded):
                    self.ended += 1
                elif isinstance(event, h2.events.RemoteSettingsChanged):
                    self.server_settings.update({k: v.new_value for k, v in event.changed_settings.items()})
            self.flush()

    def close(self) -> None:
        self.sock.close()
