"""Health says NOT_SERVING until every model's warm-up pass succeeded.

While the warm-up runs (a real one, held back until the test lets it go) the ports are open and
gRPC health, KServe readiness and HTTP /health all say not serving; once it passed, SERVING. A
model whose graph computes NaN fails its warm-up: the server never says it serves, and
`python -m service` exits 1 naming the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

import grpc
import httpx2 as httpx
import numpy as np
import onnx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import numpy_helper

from service.embedding.model import EmbeddingModel
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from service.server import Server
from tests.fixtures.models import copy_model_dir
from tests.fixtures.process import run_service
from tests.fixtures.server import server_settings

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@contextlib.asynccontextmanager
async def warming_up(models_root, caplog, monkeypatch):
    """A server whose embedding model's real warm-up waits for `release`; yields (address, HTTP URL,
    release, the start task) once the ports are open and the warm-up has begun."""
    caplog.set_level(logging.INFO)
    warming, release = asyncio.Event(), asyncio.Event()
    real_warmup = EmbeddingModel.warmup

    async def held_back(self) -> None:  # the real warm-up, once the test lets it go
        warming.set()
        await release.wait()
        await real_warmup(self)

    monkeypatch.setattr(EmbeddingModel, "warmup", held_back)
    starting = asyncio.create_task(Server.start(server_settings(models_root)))
    try:
        await asyncio.wait_for(warming.wait(), 60)
        address = re.search(r"gRPC listening on (\S+)", caplog.text).group(1)
        http_url = re.search(r"HTTP listening on (http://[^\s:]+:\d+)", caplog.text).group(1)
        yield address, http_url, release, starting
    finally:
        release.set()
        started = (await asyncio.gather(starting, return_exceptions=True))[0]
        if isinstance(started, Server):
            await started.shutdown(grace=0)


async def test_not_serving_until_the_warm_up_succeeds(embed_models_root, caplog, monkeypatch):
    async with (
        warming_up(embed_models_root, caplog, monkeypatch) as (address, http_url, release, starting),
        grpc.aio.insecure_channel(address) as channel,
        httpx.AsyncClient(base_url=http_url) as http,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.v1.EmbeddingService", "inference.v1.ModelService"):
            assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == NOT_SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == NOT_SERVING
        reply = await http.get("/health")
        assert reply.status_code == 503 and reply.json() == {"status": "NOT_SERVING"}

        release.set()
        await starting
        assert (await watch.read()).status == SERVING
        watch.cancel()
        reply = await http.get("/health")
        assert reply.status_code == 200 and reply.json() == {"status": "SERVING"}


async def test_kserve_not_ready_until_the_warm_up_succeeds(embed_models_root, caplog, monkeypatch):
    async with (
        warming_up(embed_models_root, caplog, monkeypatch) as (address, http_url, release, starting),
        grpc.aio.insecure_channel(address) as channel,
        httpx.AsyncClient(base_url=http_url) as http,
    ):
        kserve = oip_grpc.GRPCInferenceServiceStub(channel)
        assert (await kserve.ServerLive(oip.ServerLiveRequest())).live
        assert not (await kserve.ServerReady(oip.ServerReadyRequest())).ready
        assert not (await kserve.ModelReady(oip.ModelReadyRequest(name="tiny-embed"))).ready
        assert (await http.get("/v2/health/live")).status_code == 200  # the REST binding says the same
        assert (await http.get("/v2/health/ready")).status_code == 503
        assert (await http.get("/v2/models/tiny-embed/ready")).status_code == 503
        release.set()
        await starting
        assert (await kserve.ServerReady(oip.ServerReadyRequest())).ready
        assert (await kserve.ModelReady(oip.ModelReadyRequest(name="tiny-embed"))).ready
        assert (await http.get("/v2/health/ready")).json() == {"ready": True}
        assert (await http.get("/v2/models/tiny-embed/ready")).json() == {"name": "tiny-embed", "ready": True}


def poison(model_dir) -> None:
    """Every graph's largest float weight becomes NaN: the graphs load and run, and compute NaN."""
    for path in model_dir.glob("*.onnx"):
        graph = onnx.load(str(path))
        weights = [w for w in graph.graph.initializer if w.data_type == onnx.TensorProto.FLOAT]
        if not weights:  # fp16 graphs: never served on a CPU
            continue
        target = max(weights, key=lambda w: int(np.prod(w.dims)))
        target.CopyFrom(
            numpy_helper.from_array(np.full(numpy_helper.to_array(target).shape, np.nan, np.float32), target.name)
        )
        onnx.save(graph, str(path))


def test_a_failed_warm_up_never_serves_and_exits_1(tiny_models_root, tmp_path):
    poison(copy_model_dir(tiny_models_root / "tiny-embed", tmp_path))
    # --no-verify-hashes: the graphs changed after the export on purpose
    result = run_service(tmp_path, "--http-port", "0", "--no-verify-hashes", timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "gRPC listening on" in result.stderr  # it was up, NOT_SERVING, while the warm-up ran
    assert "tiny-embed" in result.stderr and "warm-up" in result.stderr, result.stderr[-3000:]
    assert not re.search(r"serving \d+ model", result.stderr) and "warmed up" not in result.stderr
