"""The ports a `--workers` group shares: reserved by the supervisor, bound by each worker with SO_REUSEPORT."""

from __future__ import annotations

import socket


def reserve_port(host: str, port: int, what: str = "gRPC") -> socket.socket:
    """A bound, never listening SO_REUSEPORT socket holding host:port (port 0: a free one) for the workers.

    A bind without SO_REUSEPORT first: it fails when anyone holds the port, where SO_REUSEPORT alone
    could join a stranger's group. Both binds set SO_REUSEADDR, as grpc and uvicorn do for the
    workers' listeners, so the previous run's connections in TIME_WAIT do not hold the port (without
    it a restart on the same ports failed "Address already in use" for a minute). Only listening
    sockets get connections, so the reservation gets none."""
    family, _, _, _, address = socket.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
            chosen = probe.getsockname()[1]
        hold = socket.socket(family, socket.SOCK_STREAM)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        hold.bind((address[0], chosen, *address[2:]))
    except OSError as e:
        raise OSError(f"cannot bind {what} to {host}:{port} ({e})") from e
    return hold
