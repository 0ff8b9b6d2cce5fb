"""`python -m service --workers 2`: two real serving processes on one port under the supervisor.

Calls over many connections reach both workers; the supervisor's /metrics sums their counters; a
killed worker is restarted and counted; SIGTERM drains every worker (calls in flight finish) and
the supervisor exits 0; a group that cannot start exits 1 instead of restarting forever.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import embed_request, generate_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.settings import Settings
from tests.fixtures.process import ServiceProcess, run_service


class WorkerGroup(ServiceProcess):
    """`python -m service --workers N` on port 0, ready once the supervisor says every worker serves."""

    def __init__(self, models_root: Path, workers: int = 2, *flags: str):
        super().__init__(
            models_root, "--workers", str(workers), *flags, ready=rf"all {workers} workers serving on (\S+)"
        )

    def pid(self, worker: int) -> int:
        return int([m for line in self.log if (m := re.search(rf"worker {worker} ready \(pid (\d+)\)", line))][-1][1])


def own_channel(address: str) -> grpc.Channel:
    """A channel with its own TCP connection (grpc shares one per target by default): the kernel
    picks a worker per connection, so many connections reach every worker."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def embed_on_new_connections(address: str, calls: int) -> None:
    for i in range(calls):
        with own_channel(address) as channel:
            response = pb_grpc.EmbeddingServiceStub(channel).Embed(embed_request([f"call {i}"]), timeout=30)
            assert len(response.embeddings) == 1


def embed_calls(metrics: dict) -> float:
    return metrics.get(
        (
            "ts_requests_total",
            (
                ("code", "OK"),
                ("method", "Embed"),
                ("model", "tiny-embed"),
                ("protocol", "grpc"),
                ("service", "EmbeddingService"),
            ),
        ),
        0.0,
    )


def worker_rpcs(metrics: dict, worker: int) -> float:
    return metrics.get(("ts_worker_rpcs_total", (("worker", str(worker)),)), 0.0)


@pytest.fixture(scope="module")
def group(tiny_models_root):
    running = WorkerGroup(tiny_models_root, 2)
    yield running
    running.proc.send_signal(signal.SIGTERM)
    try:
        running.wait()
    finally:
        running.proc.kill()


def test_calls_reach_both_workers_and_metrics_sum_across_them(group):
    before = group.metrics()
    embed_on_new_connections(group.address, 24)
    after = group.metrics()
    assert embed_calls(after) - embed_calls(before) == 24  # one count per call, whichever worker served it
    per_worker = [worker_rpcs(after, w) - worker_rpcs(before, w) for w in (0, 1)]
    assert sum(per_worker) == 24 and min(per_worker) > 0, per_worker
    assert after[("ts_workers_ready", ())] == 2
    assert after[("ts_queue_capacity", (("model", "tiny-embed"),))] == 2 * 2048  # livesum of both workers


def test_fill_mask_on_every_worker(group):
    before = group.metrics()
    for i in range(12):
        with own_channel(group.address) as channel:
            response = pb_grpc.FillMaskServiceStub(channel).FillMask(
                pb.FillMaskRequest(inputs=[f"call {i} [MASK]"], top_k=2), timeout=30
            )
            assert len(response.results[0].masks[0].candidates) == 2
            check = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="inference.v1.FillMaskService"), timeout=10
            )
            assert check.status == health_pb2.HealthCheckResponse.SERVING
    key = (
        "ts_requests_total",
        (
            ("code", "OK"),
            ("method", "FillMask"),
            ("model", "tiny-fill-mask"),
            ("protocol", "grpc"),
            ("service", "FillMaskService"),
        ),
    )
    assert group.metrics()[key] - before.get(key, 0.0) == 12


def test_health_on_any_connection_is_serving(group):
    for _ in range(8):  # connections land on either worker; each answers for itself
        with own_channel(group.address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_http_is_served_by_every_worker_on_one_port(group):
    before = group.metrics()
    for i in range(16):  # a fresh connection each: the kernel spreads them over the workers
        request = urllib.request.Request(
            group.http_url + "/v1/embeddings",
            data=f'{{"input": "http {i}"}}'.encode(),
            headers={"content-type": "application/json", "connection": "close"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status == 200
    after = group.metrics()
    per_worker = [worker_rpcs(after, w) - worker_rpcs(before, w) for w in (0, 1)]
    http_calls = (
        "ts_requests_total",
        (
            ("code", "OK"),
            ("method", "Embed"),
            ("model", "tiny-embed"),
            ("protocol", "http"),
            ("service", "EmbeddingService"),
        ),
    )
    assert after.get(http_calls, 0.0) - before.get(http_calls, 0.0) == 16
    assert sum(per_worker) == 16 and min(per_worker) > 0, per_worker  # both workers answered HTTP


def test_a_killed_worker_is_restarted_and_counted(group):
    restarts = group.metrics()[("ts_worker_restarts_total", ())]
    embed_on_new_connections(group.address, 4)
    served = embed_calls(group.metrics())
    victim = group.pid(1)
    subprocess.run(["kill", "-KILL", str(victim)], check=True)
    group.wait_for(rf"worker 1 \(pid {victim}\) exited")
    group.wait_for(rf"worker 1 ready \(pid (?!{victim}\))\d+\)")
    metrics = group.metrics()
    assert metrics[("ts_worker_restarts_total", ())] == restarts + 1
    assert metrics[("ts_workers_ready", ())] == 2
    assert embed_calls(metrics) == served  # the dead worker's counts are kept
    assert metrics[("ts_queue_capacity", (("model", "tiny-embed"),))] == 2 * 2048  # its live gauges are not
    embed_on_new_connections(group.address, 8)
    assert embed_calls(group.metrics()) == served + 8


def test_sigterm_drains_every_worker_and_exits_0(tiny_models_root):
    group = WorkerGroup(tiny_models_root, 2, "--grace-seconds", "30")
    try:
        channel = own_channel(group.address)
        inbox: queue.Queue = queue.Queue()
        embed_stream = pb_grpc.EmbeddingServiceStub(channel).EmbedStream(iter(inbox.get, None))
        inbox.put(embed_request(["before the signal"], request_id="1"))
        assert next(embed_stream).request_id == "1"
        generation = pb_grpc.GenerationServiceStub(channel)
        stream = generation.GenerateStream(generate_request("Once upon a", max_new_tokens=100))
        chunks = [next(stream)]

        group.proc.send_signal(signal.SIGTERM)
        group.wait_for(r"worker \d+ pid \d+\] service.server: shutting down")
        chunks += list(stream)  # the generation accepted before the signal runs to its end
        assert chunks[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
        assert sum(len(c.token_ids) for c in chunks) > 1
        inbox.put(embed_request(["after the signal"], request_id="2"))  # the open stream is still served
        assert next(embed_stream).request_id == "2"
        inbox.put(None)
        assert list(embed_stream) == []
        channel.close()
        assert group.wait() == 0, "".join(group.log)
        assert len([line for line in group.log if re.search(r"worker \d \(pid \d+\) exited with 0", line)]) == 2
    finally:
        group.proc.kill()


def test_a_group_that_cannot_start_exits_1_without_restarting(tmp_path):
    result = run_service(tmp_path, "--workers", "2", timeout=120)
    assert result.returncode == 1 and "no model directories" in result.stderr
    assert "restarting worker" not in result.stderr


def test_workers_refuse_a_port_in_use(embed_models_root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_service(embed_models_root, "--workers", "2", port=port)
    assert result.returncode == 1 and f"cannot bind gRPC to 127.0.0.1:{port}" in result.stderr


def test_auto_workers_follow_device_and_cores():
    from service.worker import MAX_AUTO_WORKERS, auto_workers, usable_cores

    assert auto_workers(Settings.from_env(env={}, workers=0, device="cuda")) == 1
    cpu = Settings.from_env(env={}, workers=0, device="cpu", compute_workers=1, intra_op_threads=1)
    assert auto_workers(cpu) == min(MAX_AUTO_WORKERS, usable_cores())
    wide = dataclasses.replace(cpu, compute_workers=usable_cores() + 1)
    assert auto_workers(wide) == 1  # never fewer than one process
    with pytest.raises(ValueError, match="workers must be >= 0"):
        Settings.from_env(env={"TS_WORKERS": "-1"})


def test_engines_one_per_visible_gpu(monkeypatch):
    """`--engines 0` is one engine core per GPU CUDA_VISIBLE_DEVICES names (indices or UUIDs), and the
    supervisor gives engine i the i-th (in turn when there are more engines than GPUs); on a CPU, one."""
    from service import supervisor as sv
    from service.worker import auto_engines, cuda_devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-5d1f,")
    assert cuda_devices() == ["3", "GPU-5d1f"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,-1,3")  # CUDA sees none past a -1
    assert cuda_devices() == ["2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-5d1f,")
    cuda = Settings.from_env(env={}, device="cuda", frontends=2)
    assert auto_engines(cuda) == 2
    assert auto_engines(dataclasses.replace(cuda, frontends=-1)) == 1  # no front ends: one process
    assert auto_engines(Settings.from_env(env={}, device="cpu", frontends=2)) == 1
    assert sv.Supervisor(dataclasses.replace(cuda, engines=3)).gpus == ["3", "GPU-5d1f"]
    assert sv.Supervisor(dataclasses.replace(cuda, engines=1)).gpus == []  # one engine keeps what it sees
    assert sv.Supervisor(Settings.from_env(env={}, device="cpu", frontends=2, engines=2)).gpus == []
    with pytest.raises(ValueError, match="engines > 1 needs --frontends"):
        Settings.from_env(env={"TS_ENGINES": "2", "TS_FRONTENDS": "-1"})


def test_restarts_back_off_and_a_crash_loop_stops_the_group(tmp_path):
    """The restart policy alone, on exits of stand-in processes (the real kill is tested above)."""
    from service import supervisor as sv

    class Exited:  # what the supervisor reads of a process that has exited
        pid, exitcode, sentinel = 999_999, -9, -1

        def join(self) -> None:
            pass

    group = sv.Supervisor(Settings.from_env(env={}, workers=2))
    group.metrics_dir, group.served = tmp_path, True
    delays = []
    for _ in range(sv.CRASH_LOOP_RESTARTS):
        mine, _theirs = multiprocessing.Pipe()
        group.workers[0] = sv.Worker(0, Exited(), mine, ready=True)
        start = time.monotonic()
        group._on_exit(group.workers[0])
        delays.append(round(group.restart_at.pop(0) - start))
    assert delays == [1, 2, 4, 8, 16] and group.stop_deadline is None
    mine, _theirs = multiprocessing.Pipe()
    group.workers[0] = sv.Worker(0, Exited(), mine, ready=True)
    group._on_exit(group.workers[0])  # one exit more within the window: a crash loop
    assert group.stop_deadline is not None and group.exit_code == 1 and not group.restart_at
