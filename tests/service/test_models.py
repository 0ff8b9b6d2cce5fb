"""The models core (service/models.py) through every door of one real server: gRPC ModelService, HTTP
/v1/models and KServe (gRPC and REST) metadata agree on what is served and on one rule for a name."""

from __future__ import annotations

import grpc
import httpx2 as httpx
import pytest

from service.proto import inference_pb2 as pb
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from tests.fixtures.server import status_of

EMPTY = "model name is empty; name a served model"


async def test_every_door_lists_the_same_models(server):
    grpc_models = (await server.models.ListModels(pb.ListModelsRequest())).models
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        listed = (await http.get("/v1/models")).json()["data"]
        index = (await http.post("/v2/repository/index", json={})).json()
        one = (await http.get("/v1/models/tiny-embed")).json()
    names = sorted(m.name for m in grpc_models)
    assert names == sorted(m["id"] for m in listed) == sorted(m["name"] for m in index)
    assert {"tiny-embed", "tiny-gpt", "tiny-translate"} <= set(names)
    by_name = {m.name: m for m in grpc_models}
    for m in listed:
        g = by_name[m["id"]]
        assert (m["kind"], m["is_default"], m["max_input_tokens"], m["embedding_dimension"]) == (
            g.kind,
            g.is_default,
            g.max_input_tokens,
            g.embedding_dimension,
        )
    assert one["embedding_dimension"] == by_name["tiny-embed"].embedding_dimension > 0
    metadata = await oip_grpc.GRPCInferenceServiceStub(server.channel).ModelMetadata(
        oip.ModelMetadataRequest(name="tiny-embed")
    )
    assert list(metadata.outputs[0].shape) == [-1, by_name["tiny-embed"].embedding_dimension]


async def test_an_empty_model_name_is_invalid_at_every_door(server):
    """gRPC GetModel and KServe said INVALID_ARGUMENT, HTTP GET /v1/models/ said 404 "unknown model ''"."""
    code, details = await status_of(server.models.GetModel(pb.GetModelRequest(name="")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and EMPTY in details
    code, details = await status_of(
        oip_grpc.GRPCInferenceServiceStub(server.channel).ModelMetadata(oip.ModelMetadataRequest(name=""))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and EMPTY in details
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.get("/v1/models/")
    assert reply.status_code == 400, reply.text
    assert EMPTY in reply.text


@pytest.mark.parametrize("name", ["nope", "tiny-embed/1"])
async def test_an_unknown_model_is_not_found_naming_the_served_ones(server, name):
    code, details = await status_of(server.models.GetModel(pb.GetModelRequest(name=name)))
    assert code == grpc.StatusCode.NOT_FOUND and "tiny-embed" in details
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.get(f"/v1/models/{name}")
    assert reply.status_code == 404 and "tiny-embed" in reply.text
