"""`python -m service`: run the gRPC service (flags and TS_* variables: service/settings.py).

    python -m service --models models --host 127.0.0.1 --port 50051 --metrics-port 9464
    python -m service --workers 2 ...     # 2 serving processes on one port (service/supervisor.py)
    python -m service --frontends 2 ...   # 2 front ends before one engine core (service/split/)
    python -m service --frontends 4 --engines 2 ...  # 4 front ends before 2 engine cores (one per GPU)
    python -m service --http-port 8080    # OpenAI-compatible HTTP beside gRPC (-1: off; service/http/)

Exits 0 after a graceful SIGTERM / SIGINT shutdown, 1 when it cannot start (the log says why:
a bad model directory, strict provider fallback, a port in use). Runs itself again at once with
malloc on transparent huge pages where the kernel grants them on request (service/memory.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys

from service.memory import huge_pages_env
from service.settings import Settings
from service.supervisor import Supervisor
from service.worker import auto_engines, auto_frontends, auto_workers, configure_logging

log = logging.getLogger("service")


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):  # until the server's own handlers
        signal.signal(sig, signal.SIG_IGN)  # (service/signals.py): their default action ends the process
    settings = Settings.from_args(argv)
    configure_logging(settings.log_level)
    if settings.workers == 0:
        settings = dataclasses.replace(settings, workers=auto_workers(settings))
        log.info("workers: %d (auto)", settings.workers)
    if settings.engines == 0:
        settings = dataclasses.replace(settings, engines=auto_engines(settings))
        if settings.engines > 1:
            log.info("engines: %d (auto: one per visible GPU)", settings.engines)
    if settings.frontends == 0:
        settings = dataclasses.replace(settings, frontends=auto_frontends(settings))
        if settings.engines > 1 and not settings.frontends:  # several engines are fed by front ends
            settings = dataclasses.replace(settings, frontends=1)
        log.info("frontends: %s (auto)", settings.frontends or "off")
    if settings.workers > 1 or settings.frontends > 0:
        return Supervisor(settings).run()
    from service.server import run  # here, not at import: a supervisor never loads onnxruntime

    return run(settings)


if __name__ == "__main__":
    # The same command again, its malloc on transparent huge pages where the kernel grants them on
    # request (service/memory.py `huge_pages_env`; GLIBC_TUNABLES=glibc.malloc.hugetlb=0 opts out).
    if sys.executable and (env := huge_pages_env(os.environ)) is not None:
        os.execve(sys.executable, sys.orig_argv, env)
    sys.exit(main())
