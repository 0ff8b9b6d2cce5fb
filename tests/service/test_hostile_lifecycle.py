"""Hostile clients against the service's lifecycle and memory (issue 33), each on a real server and real
sockets (raw HTTP/2 through `h2`: bench/rawh2.py): a stuck health Watch cannot hold the drain, answers a
client never reads are bounded per connection, signals are handled from the first moment, the metrics
port holds no thread for an idle connection, `--workers` notices a worker that stops answering and
restarts on its own ports. bench/hostile_lifecycle.py measures the same cases against a server process.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import signal
import socket
import threading
import urllib.request

import grpc
import h2.settings
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import ServiceProcess as BenchService
from bench.procstat import rss_mb
from bench.rawh2 import RawGrpc
from service import metrics_server
from service.proto import inference_pb2 as pb
from service.proto.inference_pb2_grpc import EmbeddingServiceStub
from tests.fixtures.process import ServiceProcess
from tests.fixtures.server import until

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
WATCH = "/grpc.health.v1.Health/Watch"


def stuck_watches(address: str, streams: int = 1) -> RawGrpc:
    """A connection with a window of 0 whose Watch answers can never be written."""
    raw = RawGrpc(address, window=0)
    for _ in range(streams):
        raw.call(WATCH, health_pb2.HealthCheckRequest().SerializeToString())
    raw.flush()
    raw.pump(0.3)  # the server's settings read and acknowledged; no answer byte can come
    return raw


async def test_a_stuck_watch_does_not_hold_status_changes_or_the_drain(start_server, embed_models_root):
    running = await start_server(embed_models_root, grace_seconds=30.0)
    stuck = await asyncio.to_thread(stuck_watches, running.address, 20)
    closed = await asyncio.to_thread(stuck_watches, running.address, 20)
    closed.close()  # stuck streams whose connection has gone
    health = health_pb2_grpc.HealthStub(running.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest())
    assert (await watch.read()).status == SERVING
    stopping = running.server.shutdown()
    assert (await watch.read()).status == NOT_SERVING
    await asyncio.wait_for(stopping, 60)  # the guard of a hang; before: never
    stuck.close()


def test_sigterm_with_a_stuck_watch_open_drains_and_exits_0(embed_models_root):
    service = ServiceProcess(embed_models_root, "--grace-seconds", "30")
    try:
        stuck = stuck_watches(service.address, 5)
        with grpc.insecure_channel(service.address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert next(watch).status == SERVING
            service.proc.send_signal(signal.SIGTERM)
            assert next(watch).status == NOT_SERVING
            assert service.wait(60) == 0, "".join(service.log)
        stuck.close()
        assert service.find(r"\bstopped\b") and not service.find("Traceback"), "".join(service.log)
    finally:
        service.kill()


def test_signals_while_starting_and_sigusr1_do_not_end_the_process_without_its_drain(tiny_models_root):
    """Sent as gRPC binds, before the models warm up: SIGHUP and SIGUSR1 killed the process there (their
    default action); now they are handled (SIGUSR1 ignored) and a SIGTERM then drains to exit 0."""
    service = ServiceProcess(tiny_models_root, ready=r"gRPC listening on (\S+)")
    try:
        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            service.proc.send_signal(sig)
        service.wait_for(r"serving \d+ model\(s\)")
        service.proc.send_signal(signal.SIGUSR1)
        service.wait_for("received SIGUSR1; ignored")
        with grpc.insecure_channel(service.address) as channel:
            assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status == SERVING
        assert service.stop() == 0, "".join(service.log)
        assert service.find(r"\bstopped\b") and not service.find("Traceback"), "".join(service.log)
    finally:
        service.kill()


def test_sigterm_while_starting_drains_once_started_and_exits_0(tiny_models_root):
    service = ServiceProcess(tiny_models_root, ready=r"gRPC listening on (\S+)")
    try:
        service.proc.send_signal(signal.SIGTERM)
        assert service.wait(60) == 0, "".join(service.log)
        assert service.find(r"\bstopped\b") and not service.find("Traceback"), "".join(service.log)
    finally:
        service.kill()


async def test_calls_past_the_stream_bound_of_a_connection_are_refused(start_server, embed_models_root):
    """A client that never reads sends 50 calls at once on one connection, ignoring the server's
    SETTINGS: the server takes `grpc_max_streams` of them and refuses the rest (REFUSED_STREAM), so
    the answers it holds for one connection are bounded."""
    running = await start_server(embed_models_root, grpc_max_streams=10)
    raw = RawGrpc(running.address)
    for _ in range(50):
        raw.call("/inference.v1.ModelService/ListModels", pb.ListModelsRequest().SerializeToString())
    raw.flush()
    await asyncio.to_thread(raw.pump, 2.0)
    raw.close()
    assert raw.server_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 10
    assert (raw.ended, raw.refused) == (10, 40)


async def test_a_client_with_hundreds_of_calls_in_flight_on_one_channel_is_served(start_server, embed_models_root):
    """A batch client keeps 300 calls in flight on one channel: every call is answered. grpc's own
    client does not hold calls back at the server's stream bound: with a bound of 100, 100 calls in
    flight were refused (UNAVAILABLE, REFUSED_STREAM), so the default bound sits far above that."""
    running = await start_server(embed_models_root)
    async with grpc.aio.insecure_channel(running.address) as channel:
        stub = EmbeddingServiceStub(channel)
        answers = await asyncio.gather(*(stub.Embed(pb.EmbedRequest(inputs=[f"text {i}"])) for i in range(300)))
    assert len(answers) == 300 and all(len(a.embeddings) == 1 for a in answers)


async def test_memory_goes_back_after_refused_large_grpc_requests(embed_models_root):
    """A process of its own (this one's RSS counts every test). Before: +30 MB resident per refused
    15 MB Embed, kept (the last call's traceback held its request; glibc kept the rest)."""
    server = await asyncio.to_thread(BenchService, embed_models_root, [])
    try:
        options = [("grpc.max_send_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(server.address, options=options) as channel:
            stub = EmbeddingServiceStub(channel)
            await stub.Embed(pb.EmbedRequest(inputs=["warm"]))
            before = rss_mb(server.proc.pid)
            for _ in range(6):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Embed(pb.EmbedRequest(inputs=["hello " * 2621440], truncate=False))
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            try:
                await until(lambda: rss_mb(server.proc.pid) < before * 1.3, timeout=30)
            except TimeoutError:
                raise AssertionError(f"RSS {before:.0f} MiB before, {rss_mb(server.proc.pid):.0f} now") from None
    finally:
        await asyncio.to_thread(server.stop)


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


async def test_metrics_port_bounds_threads_and_closes_idle_connections(start_server, embed_models_root, monkeypatch):
    """Before: one thread per connection, waiting forever (268 threads for 252 half-sent requests)."""
    monkeypatch.setattr(metrics_server._Handler, "timeout", 1.0)
    running = await start_server(embed_models_root)
    threads = threading.active_count()
    socks = []
    for _ in range(metrics_server.MAX_CONNECTIONS + 20):
        sock = socket.create_connection(("127.0.0.1", running.metrics_port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")  # never finished
        sock.setblocking(False)
        socks.append(sock)
    await until(lambda: sum(closed_by_server(s) for s in socks) >= 20)  # the ones past the cap, at once
    assert threading.active_count() - threads <= metrics_server.MAX_CONNECTIONS
    await until(lambda: all(closed_by_server(s) for s in socks), timeout=30)  # the rest: timed out
    for sock in socks:
        sock.close()
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(running.metrics_url, timeout=10).read().decode())
    assert "ts_requests_total" in text


class Group(ServiceProcess):
    """`python -m service --workers 2`, ready once the supervisor says both serve."""

    def __init__(self, models_root, *flags: str, env: dict[str, str] | None = None):
        super().__init__(models_root, "--workers", "2", *flags, ready=r"all 2 workers serving on (\S+)", env=env)

    def pid(self, worker: int) -> int:
        return int([m for line in self.log if (m := re.search(rf"worker {worker} ready \(pid (\d+)\)", line))][-1][1])


def embed_on_new_connections(address: str, calls: int) -> None:
    for i in range(calls):
        with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            assert EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(inputs=[f"call {i}"]), timeout=30).embeddings


def test_a_worker_that_answers_no_ping_is_killed_and_replaced(embed_models_root):
    """SIGSTOP stands in for a blocked event loop: before, it was never noticed and the kernel went on
    handing it connections (13 of 20 new calls timed out)."""
    group = Group(embed_models_root, "--worker-liveness-s", "2", "--http-port", "-1")
    try:
        stopped = group.pid(0)
        os.kill(stopped, signal.SIGSTOP)
        group.wait_for(rf"worker 0 \(pid {stopped}\) answered no ping")
        group.wait_for(rf"worker 0 ready \(pid (?!{stopped}\))")
        embed_on_new_connections(group.address, 10)
        assert group.stop() == 0, "".join(group.log)
    finally:
        group.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_workers_restart_on_the_same_ports_after_sigterm(embed_models_root):
    """Before: the supervisor's port check bound without SO_REUSEADDR, and the connections the last
    run closed (TIME_WAIT) made it fail "Address already in use" for a minute."""
    ports = ["--port", str(free_port()), "--http-port", str(free_port()), "--metrics-port", "-1"]
    first = Group(embed_models_root, *ports)
    try:
        embed_on_new_connections(first.address, 4)
        kept = [http.client.HTTPConnection(first.http_url.removeprefix("http://")) for _ in range(4)]
        for conn in kept:  # keep-alive connections the drain closes: the server's side waits in TIME_WAIT
            conn.request("GET", "/health")
            assert conn.getresponse().read()
        assert first.stop() == 0, "".join(first.log)
    finally:
        first.kill()
    second = Group(embed_models_root, *ports)
    try:
        embed_on_new_connections(second.address, 2)
        assert second.stop() == 0, "".join(second.log)
    finally:
        second.kill()


def test_a_killed_supervisors_metrics_folder_is_removed_by_the_next_start(embed_models_root, tmp_path):
    env = {"TMPDIR": str(tmp_path)}
    first = Group(embed_models_root, "--http-port", "-1", env=env)
    try:
        (left,) = tmp_path.glob("ts-metrics-*")
        first.proc.kill()  # no chance to clean up; its workers drain on their own (their pipe closed)
        first.wait()
    finally:
        first.kill()
    assert left.is_dir()
    second = Group(embed_models_root, "--http-port", "-1", env=env)
    try:
        assert not left.exists() and len(list(tmp_path.glob("ts-metrics-*"))) == 1
        assert second.stop() == 0, "".join(second.log)
    finally:
        second.kill()
    assert not list(tmp_path.glob("ts-metrics-*"))
