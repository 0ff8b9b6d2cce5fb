"""FillMask through every other door and with the shipped model: bearer tokens, the KServe door,
attention inspection, the client CLI, HTTP `POST /v1/fill-mask`, and the trained checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import pytest

from client import AsyncClient, fill_mask_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from tests.client.test_service_client import cli
from tests.fixtures.server import status_of
from tests.paths import ROOT
from tests.service.fillmask.test_service_fillmask import MODEL


async def test_bearer_tokens_guard_fill_mask(start_server, fill_models_root):
    srv = await start_server(fill_models_root, auth_tokens="fill-secret")
    async with AsyncClient(srv.address) as anonymous, AsyncClient(srv.address, token="fill-secret") as client:
        code, details = await status_of(anonymous.fill_mask(["a [MASK]"]))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "missing credentials" in details
        response = await client.fill_mask(["a [MASK]"], top_k=2)
        assert len(response.results[0].masks[0].candidates) == 2


async def test_kserve_door_serves_fill_mask(start_server, fill_models_root):
    """Ready, described and inferred like every other kind: [inputs, masks, top_k] tensors equal to FillMask's."""
    srv = await start_server(fill_models_root)
    stub = oip_grpc.GRPCInferenceServiceStub(srv.channel)
    assert (await stub.ModelReady(oip.ModelReadyRequest(name=MODEL))).ready
    meta = await stub.ModelMetadata(oip.ModelMetadataRequest(name=MODEL))
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("token", "BYTES", [-1, -1, -1]),
        ("token_id", "INT64", [-1, -1, -1]),
        ("score", "FP32", [-1, -1, -1]),
    ]
    texts = ["The cat sat on the [MASK].", "a [MASK] b [MASK]"]
    request = oip.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [t.encode() for t in texts]
    )
    request.parameters["top_k"].int64_param = 2
    response = await stub.ModelInfer(request)
    reference = await pb_grpc.FillMaskServiceStub(srv.channel).FillMask(fill_mask_request(texts, top_k=2))
    assert [list(o.shape) for o in response.outputs] == [[2, 2, 2]] * 3
    ids = np.frombuffer(response.raw_output_contents[1], dtype="<i8").reshape(2, 2, 2)
    scores = np.frombuffer(response.raw_output_contents[2], dtype="<f4").reshape(2, 2, 2)
    assert ids[0, 1].tolist() == [-1, -1] and scores[0, 1].tolist() == [0.0, 0.0]  # input 0 has one mask
    for i, filled in enumerate(reference.results):
        for j, mask in enumerate(filled.masks):
            assert ids[i, j].tolist() == [c.token_id for c in mask.candidates]
            assert np.allclose(scores[i, j], [c.score for c in mask.candidates], atol=1e-7)


async def test_attention_of_the_fill_mask_model(start_server, fill_models_root):
    srv = await start_server(fill_models_root)
    response = await pb_grpc.InspectionServiceStub(srv.channel).Attention(
        pb.AttentionRequest(model=MODEL, text="a [MASK] b")
    )
    assert response.kind == "fill-mask" and response.maps and all(m.kind == pb.SELF for m in response.maps)


async def test_client_cli(start_server, fill_models_root):
    srv = await start_server(fill_models_root)
    rc, out, _ = await cli(srv.address, "fill-mask", "The cat sat on the [MASK].", "[MASK] b", "--top-k", "3", "--json")
    response = json.loads(out)
    assert rc == 0 and response["model"] == MODEL
    assert [len(r["masks"][0]["candidates"]) for r in response["results"]] == [3, 3]
    rc, out, _ = await cli(srv.address, "fill-mask", "The cat sat on the [MASK].", "--model", MODEL)
    assert rc == 0 and out.startswith("The cat sat on the [MASK].\n") and out.count("mask 0") == 5
    rc, _, err = await cli(srv.address, "fill-mask", "no mask")
    assert rc == 2 and "INVALID_ARGUMENT" in err and "[MASK]" in err


async def test_http_door_mirrors_the_rpc(start_server, fill_models_root):
    import httpx2 as httpx

    srv = await start_server(fill_models_root)
    request = fill_mask_request(["The cat sat on the [MASK].", "a [MASK] b [MASK]"], top_k=3)
    rpc = await pb_grpc.FillMaskServiceStub(srv.channel).FillMask(request)
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        reply = await http.post("/v1/fill-mask", json={"inputs": list(request.inputs), "top_k": 3})
        bad = await http.post("/v1/fill-mask", json={"inputs": ["no mask"]})
    assert reply.status_code == 200
    body = reply.json()
    assert body["model"] == MODEL and "usage" in body
    got = [
        [[(c["token_id"], c["token"], c["sequence"]) for c in m["candidates"]] for m in r["masks"]]
        for r in body["results"]
    ]
    assert got == [[[(c.token_id, c.token, c.sequence) for c in m.candidates] for m in r.masks] for r in rpc.results]
    assert bad.status_code == 400 and "inputs[0]" in bad.json()["error"]["message"]


SHIPPED = ROOT / "checkpoints" / "mlm-encoder"


@pytest.fixture(scope="module")
def shipped_root() -> Path:
    """The shipped fill-mask checkpoint exported through the gate (as `make models`), cached."""
    if not (SHIPPED / "model.safetensors").is_file():
        pytest.skip("the shipped fill-mask checkpoint is not in this checkout")
    from export.modeldir import source_hash
    from export.train.checkpoint import build_checkpoint
    from tests.fixtures.models import cached_build

    files = sorted(p for p in SHIPPED.iterdir() if p.is_file())
    key = "mlm-" + source_hash(files)[:16]
    return cached_build(key, [SHIPPED.name], lambda tmp: build_checkpoint(SHIPPED, tmp / SHIPPED.name, ()))


async def test_the_shipped_model_fills_easy_masks(start_server, shipped_root):
    srv = await start_server(shipped_root)
    response = await pb_grpc.FillMaskServiceStub(srv.channel).FillMask(
        fill_mask_request(
            ["Once upon a [MASK], there was a little girl named Lily.", "[MASK] upon a time, there was a boy."]
        )
    )
    assert response.model == SHIPPED.name
    best = [r.masks[0].candidates[0] for r in response.results]
    assert [c.token for c in best] == ["time", "once"], response
    assert best[0].sequence == "once upon a time, there was a little girl named lily."
