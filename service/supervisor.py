"""`--workers N` (N > 1): N serving processes on one gRPC port under one supervisor process.

An event loop and the GIL cap one process at about one core of serving work, so N spawned
processes, each with its own sessions and executor, share the port through SO_REUSEPORT (the
kernel hands each new connection to one worker), as Gunicorn's arbiter does. A worker loads and
warms its models before it binds, then reports ready; SIGTERM / SIGINT drain every worker and the
supervisor exits 0 only when all exited 0; a worker that dies while the group serves is restarted
with backoff (`ts_worker_restarts_total`), and a crash loop or a failure before the group first
served stops the group (exit 1). Metrics use prometheus_client's multiprocess mode, aggregated on
the supervisor's metrics port. SIGHUP is passed on (tokens re-read). Details: docs/design/workers.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import mark_process_dead

from service import metrics_server
from service.metrics_dir import FolderCollector, own_metrics_dir
from service.ports import reserve_port
from service.settings import Settings
from service.worker import cuda_devices, engine_main, frontend_main, on_cuda, usable_cores, worker_main

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
BACKOFF_SECONDS, MAX_BACKOFF_SECONDS = 1.0, 30.0
CRASH_LOOP_RESTARTS, CRASH_LOOP_WINDOW_SECONDS = 5, 60.0
KILL_AFTER_GRACE_SECONDS = 15.0
PING_INTERVAL_S = 1.0  # liveness pings to each serving worker (settings.worker_liveness_s)


@dataclasses.dataclass
class Worker:
    index: int
    process: multiprocessing.process.BaseProcess
    conn: Connection  # the supervisor's end of the worker's pipe
    ready: bool = False
    answered: float = 0.0  # monotonic time of its last message (ready, or a ping's answer)
    pinged: float = 0.0  # monotonic time of the last ping sent
    killed: bool = False  # killed for answering no ping; its exit restarts it
    closed: bool = False  # its end of the pipe is closed (it is exiting): nothing more to read


def endpoint(folder: Path, engine: int) -> str:
    """--frontends: engine core `engine`'s ZMQ endpoint, a Unix socket in the group's own metrics directory."""
    return f"ipc://{folder / f'engine-{engine}.sock'}"


class Supervisor:
    """Runs the group until a signal or a crash loop stops it; `run()` returns the exit code."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.workers: dict[int, Worker] = {}
        self.restart_at: dict[int, float] = {}  # index -> monotonic time of its scheduled restart
        self.crashes: deque[float] = deque()  # monotonic times of recent worker exits
        self.restarts = 0
        self.served = False  # every worker reported ready at least once
        self.stop_deadline: float | None = None
        self.exit_code = 0
        self._signal: int | None = None
        self._hangup = False
        self._spawn = multiprocessing.get_context("spawn")
        # --frontends N --engines E: processes 0..E-1 are the engine cores, E..E+N-1 the front ends
        # (service/split/); else N workers
        self.split = settings.frontends > 0
        self.engines = max(1, settings.engines) if self.split else 0
        self.size = settings.frontends + self.engines if self.split else settings.workers
        self.serving_processes = settings.frontends if self.split else settings.workers
        # engine i's GPU, when several engines share a CUDA host: the i-th visible one (round robin)
        self.gpus = cuda_devices() if self.engines > 1 and on_cuda(settings) else []
        self._engines_stopping = False

    def run(self) -> int:
        if MULTIPROC_ENV in os.environ:  # yours: emptied at start, kept
            return self._run(Path(os.environ[MULTIPROC_ENV]))
        with own_metrics_dir() as metrics_dir:  # ours: removed at exit, or by the next start if we are killed
            return self._run(metrics_dir)

    def _run(self, metrics_dir: Path) -> int:
        metrics_dir.mkdir(parents=True, exist_ok=True)
        for stale in metrics_dir.glob("*.db"):  # a previous run's samples would be summed in
            stale.unlink()
        os.environ[MULTIPROC_ENV] = str(metrics_dir)  # inherited by every worker
        self.metrics_dir = metrics_dir
        hold = http_hold = scrape_server = None
        try:
            hold = reserve_port(self.settings.host, self.settings.port)
            if self.settings.http_port >= 0:  # the workers' HTTP servers share a port the same way
                http_hold = reserve_port(self.settings.http_address, self.settings.http_port, "HTTP")
            scrape_server = self._start_metrics()
        except OSError as e:
            log.error("cannot start: %s", e)
            for held in (hold, http_hold):
                if held is not None:
                    held.close()
            return 1
        port = hold.getsockname()[1]
        http_port = self.settings.http_port if http_hold is None else http_hold.getsockname()[1]
        self._warn_if_oversubscribed()
        count = f"{self.serving_processes} {'front ends' if self.split else 'workers'}"
        log.info("gRPC listening on %s:%d (%s, SO_REUSEPORT)", self.settings.host, port, count)
        if http_hold is not None:
            log.info(
                "HTTP listening on http://%s:%d (%s, SO_REUSEPORT)",
                self.settings.http_address,
                http_port,
                count,
            )
        self.worker_settings = dataclasses.replace(self.settings, port=port, http_port=http_port, metrics_port=-1)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_hangup)
        try:
            for index in range(self.engines if self.split else self.size):  # front ends once the engines serve
                self._start_worker(index)
            while self.workers or (self.restart_at and self.stop_deadline is None):
                self._step(wake_r)
        finally:
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            hold.close()
            if http_hold is not None:
                http_hold.close()
            if scrape_server is not None:
                scrape_server.shutdown()
                scrape_server.server_close()
        log.info("all workers stopped; exit %d", self.exit_code)
        return self.exit_code

    def _warn_if_oversubscribed(self) -> None:
        s, cores = self.settings, usable_cores()
        computing = self.engines if self.split else s.workers  # the processes that run models
        if s.device != "cuda" and computing * s.compute_workers * s.intra_op_threads > cores:
            log.warning(
                "%d %s x %d compute threads x %d intra-op threads exceed the %d usable cores; "
                "they will contend (lower --compute-workers)",
                computing,
                "engines" if self.split else "workers",
                s.compute_workers,
                s.intra_op_threads,
                cores,
            )

    def _start_metrics(self):
        if self.settings.metrics_port < 0:
            return None
        registry = CollectorRegistry()
        FolderCollector(registry, path=str(self.metrics_dir))
        registry.register(_SupervisorCollector(self))
        server = metrics_server.start(self.settings.metrics_address, self.settings.metrics_port, registry)
        log.info("metrics on http://%s:%d/metrics (all workers)", self.settings.metrics_address, server.server_port)
        return server

    def _on_signal(self, signum: int, _frame) -> None:
        self._signal = signum  # handled in _step: no logging or process work inside a signal handler

    def _on_hangup(self, _signum: int, _frame) -> None:
        self._hangup = True

    def _start_worker(self, index: int) -> None:
        mine, theirs = multiprocessing.Pipe()
        target: Callable[..., None]
        args: tuple
        if not self.split:
            target, args, name = worker_main, (self.worker_settings, index, theirs), f"ts-worker-{index}"
        elif self.is_engine(index):
            gpu = self.gpus[index % len(self.gpus)] if self.gpus else None
            target, name = engine_main, f"ts-engine-{index}"
            args = (self.worker_settings, index, theirs, endpoint(self.metrics_dir, index), gpu)
        else:
            endpoints = tuple(endpoint(self.metrics_dir, i) for i in range(self.engines))
            target, args, name = frontend_main, (self.worker_settings, index, theirs, endpoints), f"ts-frontend-{index}"
        process = self._spawn.Process(target=target, args=args, name=name)
        process.start()
        theirs.close()
        self.workers[index] = Worker(index, process, mine)
        log.info("worker %d started (pid %d)", index, process.pid)

    def _step(self, wake_r: int) -> None:
        """Waits for a worker message or exit, a signal or a due restart, and handles what came."""
        now = time.monotonic()
        due = [t for t in (*self.restart_at.values(), self.stop_deadline) if t is not None]
        timeout = max(0.0, min(due, default=now + 1.0) - now)
        watched = {w.process.sentinel: w for w in self.workers.values()}
        pipes = {w.conn: w for w in self.workers.values() if not w.closed}
        fired = wait([wake_r, *watched, *pipes], timeout=min(timeout, 1.0))
        if wake_r in fired:
            os.read(wake_r, 512)
        for obj in fired:
            if obj in pipes:
                self._on_message(pipes[obj])
        for obj in fired:
            if obj in watched:
                self._on_exit(watched[obj])
        if self._hangup:
            self._hangup = False
            log.info("received SIGHUP; passing it to %d worker(s)", len(self.workers))
            for worker in self.workers.values():
                if worker.ready and worker.process.pid is not None:  # one still starting reads the file anyway
                    os.kill(worker.process.pid, signal.SIGHUP)  # (SIGHUP would kill it)
        if self._signal is not None:
            log.info("received %s; draining %d worker(s)", signal.Signals(self._signal).name, len(self.workers))
            self._signal = None
            self._stop(exit_code=0)
        self._restart_due()
        self._stop_engines_when_alone()
        self._check_liveness()
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            for worker in self.workers.values():
                log.error(
                    "worker %d (pid %d) still running after the grace period; killing it",
                    worker.index,
                    worker.process.pid,
                )
                worker.process.kill()
            self.exit_code, self.stop_deadline = 1, float("inf")

    def _on_message(self, worker: Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            worker.closed = True  # it is exiting; its sentinel says so
            return
        worker.answered = time.monotonic()
        if message[0] != "ready" or worker.ready:
            return  # a ping's answer
        worker.ready = True
        log.info("worker %d ready (pid %d)", worker.index, worker.process.pid)
        group = self.workers.values()
        engines_only = len(group) == self.engines and all(self.is_engine(w.index) for w in group)
        if self.split and not self.served and engines_only and all(w.ready for w in group):
            for index in range(self.engines, self.size):  # the engines serve: their front ends connect
                self._start_worker(index)
        if not self.served and len(group) == self.size and all(w.ready for w in group):
            self.served = True
            host, port = self.settings.host, self.worker_settings.port
            if self.split:
                cores = "engine core" if self.engines == 1 else f"{self.engines} engine cores"
                log.info("%s and %d front ends serving on %s:%d", cores, self.serving_processes, host, port)
            else:
                log.info("all %d workers serving on %s:%d", len(self.workers), host, port)

    def _on_exit(self, worker: Worker) -> None:
        worker.process.join()
        code = worker.process.exitcode
        del self.workers[worker.index]
        worker.conn.close()
        mark_process_dead(worker.process.pid, str(self.metrics_dir))
        if self.stop_deadline is not None:
            log.info("worker %d (pid %d) exited with %s", worker.index, worker.process.pid, code)
            if code != 0:
                self.exit_code = 1
            return
        log.error("worker %d (pid %d) exited with %s", worker.index, worker.process.pid, code)
        if not self.served:
            log.error("cannot start: worker %d failed before the group served", worker.index)
            self._stop(exit_code=1)
            return
        now = time.monotonic()
        self.crashes.append(now)
        while self.crashes and self.crashes[0] < now - CRASH_LOOP_WINDOW_SECONDS:
            self.crashes.popleft()
        if len(self.crashes) > CRASH_LOOP_RESTARTS:
            log.error("crash loop: %d worker exits in %.0f s; stopping", len(self.crashes), CRASH_LOOP_WINDOW_SECONDS)
            self._stop(exit_code=1)
            return
        delay = min(MAX_BACKOFF_SECONDS, BACKOFF_SECONDS * 2 ** (len(self.crashes) - 1))
        log.info("restarting worker %d in %.1f s", worker.index, delay)
        self.restart_at[worker.index] = now + delay

    def _check_liveness(self) -> None:
        """Pings every serving worker once a second over its pipe; its event loop answers. One that
        answered nothing for `worker_liveness_s` (a blocked loop, a stopped process) is killed, and
        its exit restarts it: the kernel would go on handing it connections that nobody accepts."""
        limit = self.settings.worker_liveness_s
        if not limit or self.stop_deadline is not None:
            return
        now = time.monotonic()
        for worker in self.workers.values():
            if not worker.ready or worker.killed:
                continue
            if now - worker.answered > limit:
                log.error(
                    "worker %d (pid %d) answered no ping for %.0f s (its event loop is blocked or it is "
                    "stopped); killing it",
                    worker.index,
                    worker.process.pid,
                    now - worker.answered,
                )
                worker.killed = True
                worker.process.kill()
            elif now - worker.pinged >= PING_INTERVAL_S:
                worker.pinged = now
                with contextlib.suppress(OSError):  # it exited; its sentinel says so
                    worker.conn.send(("ping",))

    def _restart_due(self) -> None:
        now = time.monotonic()
        for index, at in list(self.restart_at.items()):
            if at <= now and self.stop_deadline is None:
                del self.restart_at[index]
                self.restarts += 1
                self._start_worker(index)

    def _stop(self, exit_code: int) -> None:
        """SIGTERM to every worker once; later calls only raise the exit code."""
        self.exit_code = max(self.exit_code, exit_code)
        if self.stop_deadline is not None:
            return
        self.stop_deadline = time.monotonic() + self.settings.grace_seconds + KILL_AFTER_GRACE_SECONDS
        self.restart_at.clear()
        for worker in self.workers.values():
            if not self.is_engine(worker.index):  # the engines drain once their front ends have
                worker.process.terminate()
        self._stop_engines_when_alone()

    def is_engine(self, index: int) -> bool:
        return self.split and index < self.engines

    def _stop_engines_when_alone(self) -> None:
        """--frontends: once every front end has exited while stopping, the engines drain and exit."""
        if not self.split or self.stop_deadline is None or self._engines_stopping:
            return
        if all(self.is_engine(index) for index in self.workers):
            self._engines_stopping = True
            for worker in self.workers.values():
                worker.process.terminate()


class _SupervisorCollector:
    """The supervisor's own series, read from its state at scrape time (no multiprocess files)."""

    def __init__(self, supervisor: Supervisor):
        self._supervisor = supervisor

    def collect(self):
        sup = self._supervisor
        yield CounterMetricFamily(
            "ts_worker_restarts", "worker processes restarted after they exited", value=sup.restarts
        )
        yield GaugeMetricFamily(
            "ts_workers_ready",
            "worker processes serving (warm, on the port)",
            value=sum(w.ready for w in list(sup.workers.values())),
        )
