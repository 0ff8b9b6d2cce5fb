"""One serving process of a `--workers` group (service/supervisor.py), and how many to run.

`worker_main` is the entry point the supervisor spawns: it logs with a `[worker I pid P]` tag,
runs the ordinary server (service/server.py) as worker I, tells the supervisor over its pipe once
it serves, answers the supervisor's liveness pings on that pipe from its event loop, and drains
when the pipe closes (the supervisor has gone).
`auto_workers` is `--workers 0`, `auto_frontends` `--frontends 0`, `auto_engines` `--engines 0`;
`serve_worker` also runs a front end of `--frontends` (service/split/frontend.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import subprocess
import sys
from multiprocessing.connection import Connection

from service.settings import Settings, usable_cores

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"
MAX_AUTO_WORKERS = 8  # every worker holds its own copy of every model
MAX_AUTO_FRONTENDS = 4


def configure_logging(level: str, tag: str = "") -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=LOG_FORMAT.format(tag=tag))


def worker_main(settings: Settings, index: int, conn: Connection) -> None:
    """A worker process: one server on the shared port; tells the supervisor when it serves."""
    sys.exit(serve_worker(settings, index, conn))


def frontend_main(settings: Settings, index: int, conn: Connection, endpoints: tuple[str, ...]) -> None:
    """A front end of `--frontends` (service/split/frontend.py): a worker over the engines at `endpoints`."""
    sys.exit(serve_worker(settings, index, conn, engines=endpoints, tag="front end"))


def engine_main(settings: Settings, index: int, conn: Connection, endpoint: str, gpu: str | None = None) -> None:
    """Engine core `index` of `--frontends` (service/split/process.py), serving its front ends at
    `endpoint`; on CUDA it sees only the visible GPU `gpu` (set before onnxruntime loads)."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    configure_logging(settings.log_level, tag=f"[engine {index} pid {os.getpid()}] ")
    from service.split import process  # here, not at import: the supervisor never loads onnxruntime

    sys.exit(process.run(settings, conn, endpoint, index))


def serve_worker(
    settings: Settings, index: int, conn: Connection, engines: tuple[str, ...] = (), tag: str = "worker"
) -> int:
    """Runs a worker's server (a front end's with `engines`: service/split/) and returns its exit code."""
    configure_logging(settings.log_level, tag=f"[{tag} {index} pid {os.getpid()}] ")
    from service.server import run  # here, not at import: the supervisor never loads onnxruntime

    def on_ready(server) -> None:
        conn.send(("ready", os.getpid()))
        asyncio.get_running_loop().add_reader(conn.fileno(), _on_supervisor_message, server, conn)

    return run(settings, worker=index, on_ready=on_ready, engines=engines)


def _on_supervisor_message(server, conn: Connection) -> None:
    """The pipe turned readable: a liveness ping, answered from the event loop (a loop that is
    blocked answers none, and the supervisor replaces the worker); EOF: the supervisor has gone,
    drain and exit."""
    try:
        conn.recv()
        conn.send(("pong",))
    except (EOFError, OSError):
        asyncio.get_running_loop().remove_reader(conn.fileno())
        log.warning("supervisor gone; draining")
        server.shutdown()


def auto_workers(settings: Settings) -> int:
    """`--workers 0`: 1 where CUDA runs the models (one GPU context and copy of the weights per
    process); on a CPU, as many workers as the cores hold `compute_workers x intra_op_threads`
    threads each, at most MAX_AUTO_WORKERS. docs/design/workers.md has the measurements."""
    if on_cuda(settings):
        return 1
    threads = settings.compute_workers * settings.intra_op_threads
    return max(1, min(MAX_AUTO_WORKERS, usable_cores() // threads))


def auto_frontends(settings: Settings) -> int:
    """`--frontends 0`: where CUDA runs the models and one process serves them (`--workers 1`), front
    ends up to the cores left beside the engine, at most MAX_AUTO_FRONTENDS; else 0 (off: on a CPU the
    split costs more than it frees, docs/design/engine-core.md has the measurements)."""
    if settings.workers != 1 or not on_cuda(settings):
        return 0
    return max(1, min(MAX_AUTO_FRONTENDS, usable_cores() - max(1, settings.engines)))


def auto_engines(settings: Settings) -> int:
    """`--engines 0`: one engine core per visible GPU where CUDA runs the models (onnxruntime runs a
    session on one device; data parallel, as TEI advises), else 1 (and 1 without front ends)."""
    if settings.frontends < 0 or settings.workers != 1 or not on_cuda(settings):
        return 1
    return max(1, len(cuda_devices()))


def cuda_devices() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs): that
    variable when set, else every GPU `nvidia-smi -L` lists; [] where neither says."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA stops at the first -1 ("none past here")
        names = [d.strip() for d in visible.split(",") if d.strip()]
        return list(itertools.takewhile(lambda d: d != "-1", names))
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))]


def on_cuda(settings: Settings) -> bool:
    if settings.device == "cuda":
        return True
    if settings.device == "auto":
        import onnxruntime  # only here: a supervisor with an explicit count never loads it

        return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    return False
