"""The server: models, the cores and every door over them, health, reflection, metrics and the drain.

`Server.start` loads every model directory, builds the cores (service/cores.py), registers every
gRPC service one way (`register(server, cores)` of each module in `GRPC_DOORS`),
binds with health NOT_SERVING, warms every model up, then serves (a worker of several warms up
before it binds, so the kernel never hands a connection to a cold one). SIGTERM / SIGINT (handled
from the first moment of `serve`: service/signals.py) start `shutdown`: health NOT_SERVING (no
Watch stream can hold it: service/health.py), new calls UNAVAILABLE (the drain gate,
service/admission.py), in-flight calls finish within `grace_seconds` with the port open, then the
queues drain and `serve()` returns 0. HTTP (service/http/) binds with gRPC over the same cores and drains with it.
The lifecycle, security and workers are in docs/design/service.md, security.md and workers.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2
from starlette.middleware import Middleware

from service import metrics
from service.auth import AuthInterceptor, Tokens, server_credentials
from service.cores import BACKENDS, Cores
from service.grpc import classification, embedding, fillmask, generation, inspection, models, sparse, translation
from service.health import HealthServicer
from service.http.app import build_app
from service.http.security import BearerAuth, ssl_options
from service.http.server import LAST_SECONDS, HttpServer
from service.inflight import Inflight, TrackCalls
from service.kinds import KINDS
from service.kserve import rest as kserve_rest
from service.kserve import servicer as kserve
from service.manifest import ModelDirError
from service.memory import MemoryTrimmer
from service.proto import inference_pb2 as pb
from service.registry import ModelLoadError, ModelRegistry
from service.runtime import ProviderError, Runtime
from service.settings import Settings
from service.signals import Signals
from service.split import frontend
from service.split.client import Engines

log = logging.getLogger(__name__)

SERVICES = {name: svc.full_name for name, svc in pb.DESCRIPTOR.services_by_name.items()}
SERVICES[kserve.SERVICE] = kserve.SERVICE_NAME  # the Open Inference Protocol (KServe v2), service/kserve
SERVICE_KINDS = {service: kind.name for kind in KINDS.values() for service in kind.services}
# The gRPC doors, each a module with `register(server, cores)`: every service is registered this one way.
GRPC_DOORS = (embedding, generation, translation, fillmask, classification, sparse, inspection, models, kserve)


class Server:
    """A running service; `address`, `port` and `metrics_port` are the ones actually bound."""

    def __init__(
        self,
        settings: Settings,
        runtime: Runtime,
        registry: ModelRegistry,
        worker: int | None = None,
        tokens: Tokens | None = None,
        credentials: grpc.ServerCredentials | None = None,
        cores: Cores | None = None,
    ):
        self.settings, self.runtime, self.registry, self.worker = settings, runtime, registry, worker
        # what every door calls (service/cores.py); a front end's forward to the engine (service/split/)
        self.cores = cores or Cores.build(registry, settings, runtime)
        self.engine: Engines | None = None  # a front end's connections to its engine cores
        self.tokens, self.credentials = tokens or Tokens(), credentials
        self._worker_calls = None if worker is None else metrics.WORKER_RPCS.labels(str(worker))
        self.inflight = Inflight()  # the drain waits for these (service/inflight.py)
        interceptors = [AuthInterceptor(self.tokens)] if self.tokens.enabled else []  # first: refuse before all
        interceptors.append(TrackCalls(self.inflight, self._worker_calls))
        self.grpc = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", settings.max_message_bytes),
                ("grpc.max_send_message_length", settings.max_message_bytes),
                # Calls per connection: a client that never reads its answers holds each one in the
                # server (its stream, its queued bytes); without a bound one connection pinned 100s of MB.
                ("grpc.max_concurrent_streams", settings.grpc_max_streams),
                # grpc sets SO_REUSEPORT by default on Linux, so a second server on a taken port would
                # silently share it; one process refuses a taken port, workers share theirs on purpose.
                ("grpc.so_reuseport", 0 if worker is None else 1),
            ],
        )
        self.health = HealthServicer()  # status changes never wait on a Watch writer (service/health.py)
        self.port = 0
        self.http: HttpServer | None = None
        self.serving = False  # the overall health status is SERVING (HTTP's /health reads it)
        self.metrics_port: int | None = None
        self._metrics_server: Any = None
        self._stopping: asyncio.Task | None = None
        self.memory = MemoryTrimmer()
        self._trimming: asyncio.Task | None = None
        self.stopped = asyncio.Event()

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    @classmethod
    async def start(cls, settings: Settings, worker: int | None = None, engines: tuple[str, ...] = ()) -> Server:
        """Loads, binds, warms up (a worker: warms up, then binds); returns once every model serves.
        With `engines` (a front end of `--frontends`), the models are the engine cores' at those endpoints."""
        tokens, credentials = Tokens.from_settings(settings), server_credentials(settings)  # bad files: fail fast
        runtime = Runtime(settings)
        client, cores = None, None
        try:
            if engines:
                client, registry, cores = await frontend.connect(settings, runtime, engines)
            else:
                registry = await asyncio.to_thread(ModelRegistry.load, settings, runtime, BACKENDS)
        except BaseException:
            runtime.close()
            raise
        server = cls(settings, runtime, registry, worker, tokens, credentials, cores)
        if client is not None:
            server.engine = client
            client.on_change = server._on_engine
        try:
            if worker is None:
                await server._bind()
                await registry.start()
            else:
                if client is None:  # a front end's models were started and warmed by its engine
                    await registry.start()
                await server._bind(health_pb2.HealthCheckResponse.SERVING)  # warm: SERVING from its first call
        except BaseException:
            await server.shutdown(grace=0)
            raise
        server._set_health(health_pb2.HealthCheckResponse.SERVING)
        server._trimming = asyncio.create_task(server.memory.run(), name="memory-trim")
        log.info("serving %d model(s) on %s", len(list(registry)), server.address)
        return server

    async def _bind(self, status: int = health_pb2.HealthCheckResponse.NOT_SERVING) -> None:
        for door in GRPC_DOORS:  # every service registered one way: its module's register(server, cores)
            door.register(self.grpc, self.cores)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        names = (
            *SERVICES.values(),
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        pool = kserve.reflection_pool(
            pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR, kserve.oip.DESCRIPTOR
        )
        reflection.enable_server_reflection(names, self.grpc, pool=pool)
        self._set_health(status)
        address = f"{self.settings.host}:{self.settings.port}"
        try:
            if self.credentials is None:
                self.port = self.grpc.add_insecure_port(address)
            else:
                self.port = self.grpc.add_secure_port(address, self.credentials)
        except RuntimeError as e:  # grpc's "Failed to bind": port in use, bad address
            raise OSError(f"cannot bind gRPC to {self.settings.host}:{self.settings.port} ({e})") from e
        await self.grpc.start()
        log.info(
            "gRPC listening on %s (%s%s)",
            self.address,
            "plaintext" if self.credentials is None else "TLS" if not self.settings.tls_client_ca else "mTLS",
            ", bearer tokens required" if self.tokens.enabled else "",
        )
        if self.settings.http_port >= 0:
            guard = [Middleware(BearerAuth, tokens=self.tokens)] if self.tokens.enabled else []
            app = build_app(
                self.cores,
                lambda: self.serving,
                middleware=guard,
                worker_calls=self._worker_calls,
                extra_routes=kserve_rest.routes(self.cores),
            )
            self.http = await HttpServer.start(
                app,
                self.settings.http_address,
                self.settings.http_port,
                reuse_port=self.worker is not None,
                ssl=ssl_options(self.settings),
                header_timeout=self.settings.http_header_timeout_s,
                write_timeout=self.settings.http_write_timeout_s,
                max_connections=self.settings.http_max_connections,
            )
        if self.settings.metrics_port >= 0:
            self._metrics_server, self.metrics_port = metrics.start_metrics_server(
                self.settings.metrics_address, self.settings.metrics_port
            )

    def _set_health(self, status: int) -> None:
        served_kinds = {b.kind for b in self.registry}
        self.serving = status == health_pb2.HealthCheckResponse.SERVING
        self.health.set("", status)
        for name, full_name in SERVICES.items():
            kind = SERVICE_KINDS.get(name)
            ok = kind is None or kind in served_kinds
            self.health.set(full_name, status if ok else health_pb2.HealthCheckResponse.NOT_SERVING)

    def _on_engine(self, up: bool) -> None:
        """A front end's last serving engine core exited (health NOT_SERVING: calls get UNAVAILABLE),
        or one is back."""
        if self._stopping is None:
            status = health_pb2.HealthCheckResponse
            self._set_health(status.SERVING if up else status.NOT_SERVING)

    def shutdown(self, grace: float | None = None) -> asyncio.Task:
        """Starts the graceful shutdown once (later calls return the same task); await it to wait."""
        if self._stopping is None:
            grace = self.settings.grace_seconds if grace is None else grace
            self._stopping = asyncio.ensure_future(self._shutdown(grace))
        return self._stopping

    async def _stop_grpc(self, grace: float) -> None:
        """Waits up to grace seconds for in-flight calls while new ones get UNAVAILABLE from the registry
        (the port stays open: no call races a closed listener), then stops grpc's server."""
        if self.inflight.count and not await self.inflight.wait_idle(grace):
            log.warning("gRPC: %d call(s) still running after %.1fs grace; cancelling", self.inflight.count, grace)
        await self.grpc.stop(LAST_SECONDS)

    async def _shutdown(self, grace: float) -> None:
        log.info("shutting down: NOT_SERVING, refusing new calls, %.1fs grace for in-flight calls", grace)
        self.registry.draining = True
        if self._trimming is not None:
            self._trimming.cancel()
        self.health.enter_graceful_shutdown()
        await asyncio.gather(self._stop_grpc(grace), *([self.http.stop(grace)] if self.http else []))
        await self.registry.stop()
        if self.engine is not None:
            self.engine.close()
        await asyncio.to_thread(self.runtime.close)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        log.info("stopped")
        self.stopped.set()


async def serve(
    settings: Settings,
    worker: int | None = None,
    on_ready: Callable[[Server], None] | None = None,
    engines: tuple[str, ...] = (),
) -> int:
    """Runs the service until a signal stops it; returns the process exit code.

    on_ready(server) is called once it serves (a worker tells its supervisor); `engines`: a front
    end's engine core endpoints (service/split/)."""
    signals = Signals()  # before the load: a signal while it runs must not kill a half-loaded process
    server = await Server.start(settings, worker, engines)
    signals.attach(server)
    if on_ready is not None:
        on_ready(server)
    await server.stopped.wait()
    return 0


def run(
    settings: Settings,
    worker: int | None = None,
    on_ready: Callable[[Server], None] | None = None,
    engines: tuple[str, ...] = (),
) -> int:
    """`serve` in a fresh event loop; 1 with the reason logged when the service cannot start."""
    try:
        return asyncio.run(serve(settings, worker, on_ready, engines))
    except (ModelDirError, ModelLoadError, ProviderError, OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return 1
