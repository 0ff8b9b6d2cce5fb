"""The engine core's process under the supervisor (service/supervisor.py with `--frontends N`):
`run` loads and warms every model, says "ready" over its pipe, answers the supervisor's
liveness pings from its event loop, and drains on SIGTERM / SIGINT (or when the pipe closes: the
supervisor has gone). Its endpoint is the group's socket (service/supervisor.py `endpoint`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from multiprocessing.connection import Connection

from service.manifest import ModelDirError
from service.registry import ModelLoadError
from service.runtime import ProviderError
from service.settings import Settings

log = logging.getLogger(__name__)


def run(settings: Settings, conn: Connection, address: str, index: int) -> int:
    """Engine `index`'s life (service/worker.py `engine_main` spawns it); its exit code."""
    try:
        return asyncio.run(_serve(settings, conn, address, index))
    except (ModelDirError, ModelLoadError, ProviderError, OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return 1


async def _serve(settings: Settings, conn: Connection, address: str, index: int) -> int:
    from service.split.engine import run_engine  # here: the supervisor never loads onnxruntime

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):  # tokens are the front ends' business
        loop.add_signal_handler(sig, lambda: None)

    def on_ready() -> None:
        conn.send(("ready", os.getpid()))
        loop.add_reader(conn.fileno(), _on_pipe, conn, stop)

    return await run_engine(settings, address, on_ready, stop, index)


def _on_pipe(conn: Connection, stop: asyncio.Event) -> None:
    try:
        conn.recv()
        conn.send(("pong",))
    except (EOFError, OSError):
        asyncio.get_running_loop().remove_reader(conn.fileno())
        log.warning("supervisor gone; draining")
        stop.set()
