"""The service as a process: `python -m service` drains on SIGTERM and exits 0 (every door:
test_drain.py); no torch is imported by the serving process; a strict provider fallback refuses to
start; stubs are fresh."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import textwrap

import grpc
import onnxruntime as ort
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import Client, embed_request
from service import protogen
from tests.fixtures.process import ServiceProcess, recorded_starts, run_service
from tests.paths import ROOT

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.slow
def test_sigterm_drains_in_flight_calls_and_exits_0(embed_models_root):
    service = ServiceProcess(embed_models_root, "--grace-seconds", "30")
    try:
        client = Client(service.address, timeout=30)
        watch = health_pb2_grpc.HealthStub(client.channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert next(watch).status == SERVING
        inbox: queue.Queue = queue.Queue()
        stream = client.embed_stream(iter(inbox.get, None))  # an in-flight call across the SIGTERM
        inbox.put(embed_request(["before the signal"], request_id="1"))
        assert next(stream).request_id == "1"

        service.proc.send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        watch.cancel()
        with pytest.raises(grpc.RpcError) as err:
            client.embed(["a new call"])
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in err.value.details()  # refused by the service, not by a closed port
        with Client(service.address, timeout=10) as fresh, pytest.raises(grpc.RpcError) as err:
            fresh.embed(["a new connection"])  # the port stays open while in-flight calls finish
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in err.value.details()
        inbox.put(embed_request(["after the signal", "still served"], request_id="2"))
        response = next(stream)
        assert response.request_id == "2" and len(response.embeddings) == 2
        inbox.put(None)
        assert list(stream) == []
        client.close()
        assert service.wait() == 0, "".join(service.log)
        assert any("stopped" in line for line in service.log)
    finally:
        service.proc.kill()


def test_serving_process_never_imports_torch(tiny_models_root):
    code = textwrap.dedent(f"""
        import asyncio, sys
        from service.server import Server
        from service.settings import Settings

        async def main():
            settings = Settings.from_env(env={{}}, models={str(tiny_models_root)!r}, port=0, metrics_port=-1,
                                           http_port=0)
            server = await Server.start(settings)
            kinds = sorted({{b.kind for b in server.registry}})
            await server.shutdown(grace=0)
            return kinds

        kinds = asyncio.run(main())
        assert kinds == ["embedding", "fill-mask", "generation", "translation"], kinds
        assert "torch" not in sys.modules, "torch was imported by the serving process"
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this machine has CUDA")
def test_strict_provider_refuses_to_start_on_fallback(embed_models_root):
    result = run_service(embed_models_root, "--device", "cuda", "--strict-provider")
    assert result.returncode == 1
    assert "refusing to start" in result.stderr


def test_bad_models_root_refuses_to_start(tmp_path):
    result = run_service(tmp_path)
    assert result.returncode == 1 and "no model directories" in result.stderr


def test_checked_in_stubs_are_fresh(tmp_path):
    for fresh in protogen.generate(tmp_path):
        checked_in = protogen.OUT / fresh.name
        assert checked_in.read_text() == fresh.read_text(), f"{checked_in} is stale: run `make protos`"


def test_port_in_use_refuses_to_start(embed_models_root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_service(embed_models_root, port=port)
    assert result.returncode == 1 and f"cannot bind gRPC to 127.0.0.1:{port}" in result.stderr


def test_the_service_runs_again_on_huge_pages_once(tmp_path):
    """Its malloc on transparent huge pages (service/memory.py `huge_pages_env`): the KV cache and
    the weights read on 2 MiB pages, where the kernel grants them on request."""
    from service.memory import huge_pages_env

    if huge_pages_env({}) is None:
        pytest.skip("this machine's kernel or C library gives nothing to ask for")
    done, starts = recorded_starts(tmp_path, ["-m", "service", "--help"], None)
    assert done.returncode == 0 and "--models" in done.stdout, done
    assert starts == ["-", "glibc.malloc.hugetlb=1"]
    done, starts = recorded_starts(tmp_path, ["-m", "service", "--help"], "glibc.malloc.hugetlb=0")  # the opt-out
    assert done.returncode == 0 and starts == ["glibc.malloc.hugetlb=0"]
