"""The Open Inference Protocol (KServe v2) over gRPC, through tritonclient.grpc unchanged (real server, tiny models).

tritonclient's blocking client runs in a thread (`call`) so the in-process server's event loop
keeps serving; its stubs and the server's, both in package `inference`, load in this one process.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.utils import InferenceServerException

from client import array, fill_mask_request, generate_request, translate_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from tests.fixtures.server import metric

TEXTS = ["Once upon a time", "The cat sat", "é ü and more"]
OUTPUTS = {
    "tiny-embed": ["embedding"],
    "tiny-gpt": ["text_output"],
    "tiny-translate": ["translation", "score"],
    "tiny-fill-mask": ["token", "token_id", "score"],
}


@pytest.fixture
async def client(server):
    triton_client = triton.InferenceServerClient(server.address)
    yield triton_client
    triton_client.close()


async def call(fn, *args, **kwargs):
    return await asyncio.to_thread(fn, *args, **kwargs)


def text_input(texts: list[str]) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
    return tensor


def decoded(result, name: str) -> list[str]:
    return [b.decode() for b in result.as_numpy(name)]


def test_both_stubs_share_one_process():
    """tritonclient's grpc_service.proto (default pool) and ours (a private pool) read each other's bytes."""
    ours = oip.ModelInferRequest(model_name="m", raw_input_contents=[b"x"])
    ours.parameters["temperature"].double_param = 0.5
    theirs = triton_pb.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.model_name == "m" and theirs.parameters["temperature"].double_param == 0.5


async def test_health_and_metadata(server, client):
    assert await call(client.is_server_live) and await call(client.is_server_ready)
    meta = await call(client.get_server_metadata)
    assert meta.name == "transformer-serving" and meta.version
    for name, outputs in OUTPUTS.items():
        assert await call(client.is_model_ready, name)
        model = await call(client.get_model_metadata, name)
        assert model.name == name and list(model.versions) == ["1"]
        assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [("text", "BYTES", [-1])]
        assert [t.name for t in model.outputs] == outputs
    embed = await call(client.get_model_metadata, "tiny-embed")
    info = await server.models.GetModel(pb.GetModelRequest(name="tiny-embed"))
    assert list(embed.outputs[0].shape) == [-1, info.embedding_dimension] and embed.outputs[0].datatype == "FP32"
    assert not await call(client.is_model_ready, "nope")
    index = await call(client.get_model_repository_index)  # Triton's extension: how a client walks the models
    assert [(m.name, m.version, m.state) for m in index.models] == [(name, "1", "READY") for name in sorted(OUTPUTS)]
    health = await health_pb2_grpc.HealthStub(server.channel).Check(
        health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_embedding_equals_embed(server, client):
    labels = {
        "service": "GRPCInferenceService",
        "method": "ModelInfer",
        "model": "tiny-embed",
        "code": "OK",
        "protocol": "grpc",
    }
    before = metric("ts_requests_total", labels)
    result = await call(client.infer, "tiny-embed", [text_input(TEXTS)], parameters={"dimensions": 8})
    reference = await server.embedding.Embed(pb.EmbedRequest(inputs=TEXTS, dimensions=8))
    vectors = result.as_numpy("embedding")
    assert vectors.dtype == np.float32 and vectors.shape == (3, 8)
    assert np.array_equal(vectors, array(reference))
    assert result.get_response().parameters["input_tokens"].int64_param == reference.usage.input_tokens
    assert metric("ts_requests_total", labels) == before + 1


async def test_generation_equals_generate(server, client):
    greedy = await call(client.infer, "tiny-gpt", [text_input(TEXTS)], parameters={"max_new_tokens": 12})
    sampled = await call(
        client.infer,
        "tiny-gpt",
        [text_input(TEXTS[:1])],
        parameters={"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.8, "seed": 5},
    )
    references = [await server.generation.Generate(generate_request(t, max_new_tokens=12)) for t in TEXTS]
    assert decoded(greedy, "text_output") == [r.text for r in references]
    reference = await server.generation.Generate(
        generate_request(TEXTS[0], max_new_tokens=12, temperature=0.9, top_p=0.8, seed=5)
    )
    assert decoded(sampled, "text_output") == [reference.text]


async def test_translation_equals_translate(server, client):
    params = {"beam_size": 2, "max_length": 16, "length_penalty": 0.8}
    result = await call(client.infer, "tiny-translate", [text_input(TEXTS)], parameters=params, request_id="r1")
    reference = await server.translation.Translate(translate_request(TEXTS, **params))
    assert decoded(result, "translation") == [t.text for t in reference.translations]
    assert np.allclose(result.as_numpy("score"), [t.score for t in reference.translations], atol=1e-6)
    assert result.get_response().id == "r1" and result.get_response().model_name == "tiny-translate"
    only_score = await call(
        client.infer,
        "tiny-translate",
        [text_input(TEXTS)],
        parameters=params,
        outputs=[triton.InferRequestedOutput("score")],
    )
    assert only_score.as_numpy("translation") is None and only_score.as_numpy("score").shape == (3,)


async def test_fill_mask_equals_fill_mask(server, client):
    texts = ["The cat sat on the [MASK].", "a [MASK] b [MASK]", "[MASK]"]
    result = await call(client.infer, "tiny-fill-mask", [text_input(texts)], parameters={"top_k": 3})
    reference = await pb_grpc.FillMaskServiceStub(server.channel).FillMask(fill_mask_request(texts, top_k=3))
    tokens, ids, scores = (result.as_numpy(n) for n in ("token", "token_id", "score"))
    assert tokens.shape == ids.shape == scores.shape == (3, 2, 3)  # inputs x most masks x top_k
    for i, filled in enumerate(reference.results):
        for j, mask in enumerate(filled.masks):
            assert [t.decode() for t in tokens[i, j]] == [c.token for c in mask.candidates]
            assert ids[i, j].tolist() == [c.token_id for c in mask.candidates]
            assert np.allclose(scores[i, j], [c.score for c in mask.candidates], atol=1e-7)
        if len(filled.masks) == 1:  # past an input's own masks: padding no client can take for a prediction
            assert tokens[i, 1].tolist() == [b""] * 3 and ids[i, 1].tolist() == [-1] * 3
    assert result.get_response().parameters["input_tokens"].int64_param == reference.usage.input_tokens


async def test_typed_contents_as_well_as_raw(server):
    """Without raw_input_contents the texts travel in contents.bytes_contents (grpcurl, other clients)."""
    request = oip.ModelInferRequest(model_name="tiny-embed")
    request.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"a b", b"c"])
    response = await oip_grpc.GRPCInferenceServiceStub(server.channel).ModelInfer(request)
    reference = await server.embedding.Embed(pb.EmbedRequest(inputs=["a b", "c"]))
    vectors = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(list(response.outputs[0].shape))
    assert np.array_equal(vectors, array(reference))


def bad_input(name: str = "text", datatype: str = "BYTES", shape=(1,)) -> triton.InferInput:
    tensor = triton.InferInput(name, list(shape), datatype)
    if datatype == "BYTES":
        tensor.set_data_from_numpy(np.array([b"hi"] * int(np.prod(shape)), dtype=np.object_).reshape(shape))
    else:
        tensor.set_data_from_numpy(np.zeros(shape, dtype=np.int32))
    return tensor


BAD = [
    ("nope", [bad_input()], {}, None, "NOT_FOUND", "unknown model 'nope'"),
    ("tiny-embed", [bad_input(name="texts")], {}, None, "INVALID_ARGUMENT", "exactly one input named 'text'"),
    ("tiny-embed", [bad_input(datatype="INT32")], {}, None, "INVALID_ARGUMENT", "it must be BYTES"),
    ("tiny-embed", [bad_input(shape=(1, 1))], {}, None, "INVALID_ARGUMENT", "it must be [N]"),
    ("tiny-embed", [bad_input()], {"max_new_tokens": 3}, None, "INVALID_ARGUMENT", "unknown parameter"),
    ("tiny-embed", [bad_input()], {"dimensions": 10_000}, None, "INVALID_ARGUMENT", "dimensions=10000"),
    (
        "tiny-gpt",
        [bad_input()],
        {"max_new_tokens": -1},
        None,
        "INVALID_ARGUMENT",
        "must be an integer in [0, 4294967295]",
    ),
    (
        "tiny-gpt",
        [bad_input()],
        {"top_k": 2**40},
        None,
        "INVALID_ARGUMENT",
        "top_k='1099511627776' does not fit: it must be an integer in [0, 4294967295]",
    ),
    ("tiny-gpt", [bad_input()], {"temperature": "hot"}, None, "INVALID_ARGUMENT", "it must be a number"),
    ("tiny-gpt", [bad_input()], {"top_p": 2.0}, None, "INVALID_ARGUMENT", "top_p must be in [0, 1]"),
    ("tiny-translate", [bad_input()], {"beam_size": 99}, None, "INVALID_ARGUMENT", "beam_size must be in"),
    ("tiny-translate", [bad_input()], {}, "text_output", "INVALID_ARGUMENT", "unknown output 'text_output'"),
]


@pytest.mark.parametrize("model, inputs, params, output, code, message", BAD)
async def test_bad_requests_get_clear_statuses(client, model, inputs, params, output, code, message):
    outputs = [triton.InferRequestedOutput(output)] if output else None
    with pytest.raises(InferenceServerException) as caught:
        await call(client.infer, model, inputs, parameters=params, outputs=outputs)
    assert caught.value.status() == f"StatusCode.{code}" and message in caught.value.message()


RAW_BAD = [
    ([2], b"\x02\x00\x00\x00hi\x09\x00\x00\x00cut", "raw BYTES content is cut"),
    ([3], b"\x02\x00\x00\x00hi", "shape=[3] holds 3 elements but its binary data 1"),
    ([0], b"", "is empty"),
    ([1], b"\x01\x00\x00\x00\xff", "not UTF-8"),
]


@pytest.mark.parametrize("shape, raw, message", RAW_BAD)
async def test_raw_contents_must_match_the_shape(server, shape, raw, message):
    request = oip.ModelInferRequest(model_name="tiny-gpt", raw_input_contents=[raw])
    request.inputs.add(name="text", datatype="BYTES", shape=shape)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await oip_grpc.GRPCInferenceServiceStub(server.channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()


CONTENTS_BAD = [
    ("BYTES", [3], [b"a", b"b"], "shape=[3] holds 3 elements but its contents 2"),
    ("BYTES", [-1], [b"a"], "shape=[-1] must be an array of non-negative integers"),
    ("FP16", [1], [], "has datatype 'FP16'; it must be BYTES"),  # refused before its contents are looked at
    ("STRING", [1], [], "datatype='STRING' is not one of"),
    ("INT32", [1], [7], "has datatype 'INT32'; it must be BYTES"),
]


@pytest.mark.parametrize("datatype, shape, values, message", CONTENTS_BAD)
async def test_typed_contents_are_checked_like_rest_tensors(server, datatype, shape, values, message):
    """contents.* decode to the same plain tensor the REST binding reads; the data plane checks both."""
    request = oip.ModelInferRequest(model_name="tiny-embed")
    tensor = request.inputs.add(name="text", datatype=datatype, shape=shape)
    if values:
        field = "bytes_contents" if datatype == "BYTES" else "int_contents"
        getattr(tensor.contents, field).extend(values)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await oip_grpc.GRPCInferenceServiceStub(server.channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()


async def test_one_raw_content_per_input(server):
    request = oip.ModelInferRequest(model_name="tiny-embed", raw_input_contents=[b"", b""])
    request.inputs.add(name="text", datatype="BYTES", shape=[0])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await oip_grpc.GRPCInferenceServiceStub(server.channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "2 raw_input_contents for 1 inputs; send one per input" in caught.value.details()


async def test_reflection_describes_the_service(server):
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    asks = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.v1.EmbeddingService"),
    ]
    listed, kserve_file, v1_file = [r async for r in stub.ServerReflectionInfo(iter(asks))]
    assert "inference.GRPCInferenceService" in {s.name for s in listed.list_services_response.service}
    assert kserve_file.file_descriptor_response.file_descriptor_proto
    assert v1_file.file_descriptor_response.file_descriptor_proto
