"""KServe v2 (Open Inference Protocol) over HTTP/REST through tritonclient.http unchanged (real server, tiny models).

tritonclient.http's blocking client (gevent) runs in one thread of its own (`Triton`), where it is
made and used, so the in-process server's event loop keeps serving. Answers are compared with the
service's own RPCs (Embed, Generate, Translate, FillMask), binary tensors (tritonclient's default)
and JSON tensors alike.
"""

from __future__ import annotations

import asyncio
import gzip
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from client import array, fill_mask_request, generate_request, translate_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.fixtures.server import metric

TEXTS = ["Once upon a time", "The cat sat", "é ü and more"]
MASKED = ["The cat sat on the [MASK].", "a [MASK] b [MASK]", "[MASK]"]
OUTPUTS = {
    "tiny-embed": ["embedding"],
    "tiny-gpt": ["text_output"],
    "tiny-translate": ["translation", "score"],
    "tiny-fill-mask": ["token", "token_id", "score"],
}


def http_url(server) -> str:
    return server.http_url.removeprefix("http://")


class Triton:
    """A tritonclient.http client living in one thread: gevent's objects never leave the thread that made them."""

    def __init__(self, url: str):
        self.thread = ThreadPoolExecutor(max_workers=1)
        self.client = self.thread.submit(triton.InferenceServerClient, url).result()

    async def __call__(self, method: str, *args, **kwargs):
        fn = getattr(self.client, method)
        return await asyncio.get_running_loop().run_in_executor(self.thread, lambda: fn(*args, **kwargs))

    async def close(self) -> None:
        await self("close")
        self.thread.shutdown()


@pytest.fixture
async def client(server):
    triton_client = Triton(http_url(server))
    yield triton_client
    await triton_client.close()


def text_input(texts: list[str], binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(texts)], "BYTES")
    return tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=binary)


def wanted(names: list[str], binary: bool) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name, binary_data=binary) for name in names]


def texts_of(result, name: str) -> list:
    return [b.decode() if isinstance(b, bytes) else b for b in result.as_numpy(name).ravel()]


async def test_a_client_walks_the_repository(server, client):
    assert await client("is_server_live") and await client("is_server_ready")
    meta = await client("get_server_metadata")
    assert meta["name"] == "transformer-serving" and meta["version"] and "binary_tensor_data" in meta["extensions"]
    index = await client("get_model_repository_index")
    assert {m["name"] for m in index} == set(OUTPUTS) and {m["state"] for m in index} == {"READY"}
    info = await server.models.GetModel(pb.GetModelRequest(name="tiny-embed"))
    for entry in index:
        name = entry["name"]
        assert await client("is_model_ready", name) and await client("is_model_ready", name, "1")
        model = await client("get_model_metadata", name)
        assert model == await client("get_model_metadata", name, "1")
        assert model["name"] == name and model["versions"] == ["1"]
        assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        assert [t["name"] for t in model["outputs"]] == OUTPUTS[name]
        result = await client("infer", name, [text_input(MASKED)])  # every kind answers the same input
        assert [o["name"] for o in result.get_response()["outputs"]] == OUTPUTS[name]
    embed = await client("get_model_metadata", "tiny-embed")
    assert embed["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, info.embedding_dimension]}]
    assert not await client("is_model_ready", "nope") and not await client("is_model_ready", "tiny-embed", "2")


@pytest.mark.parametrize("binary", [True, False])
async def test_embedding_equals_embed(server, client, binary):
    labels = {
        "service": "GRPCInferenceService",
        "method": "ModelInfer",
        "model": "tiny-embed",
        "code": "OK",
        "protocol": "http",
    }
    before = metric("ts_requests_total", labels)
    result = await client(
        "infer",
        "tiny-embed",
        [text_input(TEXTS, binary)],
        parameters={"dimensions": 8},
        outputs=wanted(["embedding"], binary),
        request_id="e1",
    )
    reference = await server.embedding.Embed(pb.EmbedRequest(inputs=TEXTS, dimensions=8))
    vectors = result.as_numpy("embedding")
    assert vectors.dtype == np.float32 and vectors.shape == (3, 8)
    assert np.array_equal(vectors, array(reference))  # JSON floats round-trip float32 exactly
    response = result.get_response()
    assert response["id"] == "e1" and response["model_name"] == "tiny-embed" and response["model_version"] == "1"
    assert response["parameters"]["input_tokens"] == reference.usage.input_tokens
    assert metric("ts_requests_total", labels) == before + 1


@pytest.mark.parametrize("binary", [True, False])
async def test_generation_equals_generate(server, client, binary):
    params = {"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.8, "seed": 5}
    result = await client(
        "infer", "tiny-gpt", [text_input(TEXTS, binary)], parameters=params, outputs=wanted(["text_output"], binary)
    )
    references = [await server.generation.Generate(generate_request(t, **params)) for t in TEXTS]
    assert texts_of(result, "text_output") == [r.text for r in references]
    assert result.get_response()["parameters"]["output_tokens"] == sum(r.usage.output_tokens for r in references)


@pytest.mark.parametrize("binary", [True, False])
async def test_translation_equals_translate(server, client, binary):
    params = {"beam_size": 2, "max_length": 16, "length_penalty": 0.8}
    result = await client(
        "infer",
        "tiny-translate",
        [text_input(TEXTS, binary)],
        parameters=params,
        outputs=wanted(["translation", "score"], binary),
    )
    reference = await server.translation.Translate(translate_request(TEXTS, **params))
    assert texts_of(result, "translation") == [t.text for t in reference.translations]
    assert np.allclose(result.as_numpy("score"), [t.score for t in reference.translations], atol=1e-6)
    only_score = await client(
        "infer", "tiny-translate", [text_input(TEXTS)], parameters=params, outputs=wanted(["score"], binary)
    )
    assert only_score.as_numpy("translation") is None and only_score.as_numpy("score").shape == (3,)


@pytest.mark.parametrize("binary", [True, False])
async def test_fill_mask_equals_fill_mask(server, client, binary):
    result = await client(
        "infer",
        "tiny-fill-mask",
        [text_input(MASKED, binary)],
        parameters={"top_k": 3},
        outputs=wanted(["token", "token_id", "score"], binary),
    )
    reference = await pb_grpc.FillMaskServiceStub(server.channel).FillMask(fill_mask_request(MASKED, top_k=3))
    tokens, ids, scores = (result.as_numpy(n) for n in ("token", "token_id", "score"))
    assert tokens.shape == ids.shape == scores.shape == (3, 2, 3)  # inputs x most masks x top_k
    assert ids.dtype == np.int64 and scores.dtype == np.float32
    for i, filled in enumerate(reference.results):
        for j in range(2):
            candidates = filled.masks[j].candidates if j < len(filled.masks) else []
            got = [
                (texts_of(result, "token")[(i * 2 + j) * 3 + c], int(ids[i, j, c]), float(scores[i, j, c]))
                for c in range(3)
            ]
            expected = [(c.token, c.token_id, pytest.approx(c.score, abs=1e-7)) for c in candidates]
            assert got == (expected or [("", -1, 0.0)] * 3)  # an input with one mask is padded past it


async def test_compressed_request_and_json_only_request(server, client):
    result = await client("infer", "tiny-embed", [text_input(TEXTS)], request_compression_algorithm="gzip")
    plain = await client("infer", "tiny-embed", [text_input(TEXTS)])
    assert np.array_equal(result.as_numpy("embedding"), plain.as_numpy("embedding"))
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a b"]}]}
    async with httpx.AsyncClient(base_url=server.http_url) as http:  # curl's way: no binary, no header
        reply = await http.post("/v2/models/tiny-embed/versions/1/infer", json=body)
        bomb = await http.post(
            "/v2/models/tiny-embed/infer",
            content=gzip.compress(b" " * 70_000_000),
            headers={"content-encoding": "gzip"},
        )
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    assert reply.json()["outputs"][0]["shape"] == [1, plain.as_numpy("embedding").shape[1]]
    assert bomb.status_code == 400 and "inflates to over" in bomb.json()["error"]


def bad_input(name: str = "text", datatype: str = "BYTES", shape=(1,)) -> triton.InferInput:
    tensor = triton.InferInput(name, list(shape), datatype)
    if datatype == "BYTES":
        return tensor.set_data_from_numpy(np.array([b"hi"] * int(np.prod(shape)), dtype=np.object_).reshape(shape))
    return tensor.set_data_from_numpy(np.zeros(shape, dtype=np.int32))


BAD = [
    ("nope", [bad_input()], {}, None, 404, "unknown model 'nope'"),
    ("tiny-embed", [bad_input(name="texts")], {}, None, 400, "exactly one input named 'text'"),
    ("tiny-embed", [bad_input(datatype="INT32")], {}, None, 400, "it must be BYTES"),
    ("tiny-embed", [bad_input(shape=(1, 1))], {}, None, 400, "it must be [N]"),
    ("tiny-embed", [bad_input()], {"max_new_tokens": 3}, None, 400, "unknown parameter"),
    ("tiny-embed", [bad_input()], {"dimensions": 10_000}, None, 400, "dimensions=10000"),
    ("tiny-gpt", [bad_input()], {"max_new_tokens": -1}, None, 400, "must be an integer in [0, 4294967295]"),
    (
        "tiny-gpt",
        [bad_input()],
        {"top_k": 2**40},
        None,
        400,
        "top_k='1099511627776' does not fit: it must be an integer in [0, 4294967295]",
    ),
    ("tiny-gpt", [bad_input()], {"temperature": "hot"}, None, 400, "it must be a number"),
    ("tiny-translate", [bad_input()], {"beam_size": 99}, None, 400, "beam_size must be in"),
    ("tiny-translate", [bad_input()], {}, "text_output", 400, "unknown output 'text_output'"),
    ("tiny-fill-mask", [bad_input()], {}, None, 400, "has no [MASK]"),
    ("tiny-fill-mask", [text_input(["[MASK]"])], {"top_k": 1000}, None, 400, "top_k=1000 is over the limit"),
]


@pytest.mark.parametrize("model, inputs, params, output, status, message", BAD)
async def test_bad_requests_get_clear_statuses(client, model, inputs, params, output, status, message):
    outputs = [triton.InferRequestedOutput(output)] if output else None
    with pytest.raises(InferenceServerException) as caught:
        await client("infer", model, inputs, parameters=params, outputs=outputs)
    assert caught.value.status() == str(status) and message in caught.value.message()


BINARY_HEADER = (
    b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}]}'
)
RAW_BAD = [  # (body, headers, message): what tritonclient would never send, but curl or a bug might
    (
        b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}',
        {},
        "inputs[0] ('text').shape=[2] holds 2 elements but its data 1",
    ),
    (
        b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [1]}]}',
        {},
        "BYTES elements must be JSON strings",
    ),
    (
        b'{"inputs": [{"name": "text", "datatype": "STRING", "shape": [1], "data": ["a"]}]}',
        {},
        "inputs[0] ('text').datatype='STRING'",
    ),
    (
        BINARY_HEADER + b"\x01\x00\x00\x00a",
        {"inference-header-content-length": str(len(BINARY_HEADER))},
        "binary_data_size=9 must be the size of its binary data",
    ),
    (b'{"inputs": []}', {}, "inputs must be a non-empty array"),
    (b"not json", {}, "JSON is not valid"),
    (b"{}", {"inference-header-content-length": "x"}, "Inference-Header-Content-Length='x'"),
    (b"{}", {"content-encoding": "br"}, "Content-Encoding 'br' is not supported"),
    (b"\x1f\x8b broken", {"content-encoding": "gzip"}, "not valid gzip data"),
]


@pytest.mark.parametrize("body, headers, message", RAW_BAD)
async def test_malformed_bodies_get_400_naming_the_field(server, body, headers, message):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post("/v2/models/tiny-embed/infer", content=body, headers=headers)
    assert reply.status_code == 400 and message in reply.json()["error"]


async def test_routes_and_versions_unknown_to_the_server(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        version = await http.post("/v2/models/tiny-embed/versions/2/infer", json={})
        metadata = await http.get("/v2/models/nope")
        unknown_route = await http.get("/v2/models/tiny-embed/stats")
        wrong_method = await http.get("/v2/models/tiny-embed/infer")
    assert version.status_code == 404 and "no version '2'" in version.json()["error"]
    assert metadata.status_code == 404 and "unknown model 'nope'" in metadata.json()["error"]
    assert unknown_route.status_code == 404 and "error" in unknown_route.json()
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


async def test_bearer_tokens_guard_the_routes_but_not_the_probes(start_server):
    srv = await start_server(auth_tokens="rest-secret")
    anonymous, client = Triton(http_url(srv)), Triton(http_url(srv))
    token = {"Authorization": "Bearer rest-secret"}
    try:
        assert await anonymous("is_server_live") and await anonymous("is_server_ready")
        with pytest.raises(InferenceServerException) as caught:
            await anonymous("infer", "tiny-embed", [text_input(TEXTS)])
        assert caught.value.status() == "401"
        with pytest.raises(InferenceServerException):
            await anonymous("get_model_metadata", "tiny-embed")
        result = await client("infer", "tiny-embed", [text_input(TEXTS)], headers=token)
        assert result.as_numpy("embedding").shape[0] == 3
    finally:
        await anonymous.close()
        await client.close()


async def test_a_full_queue_is_429(start_server, fill_models_root):
    """Room for 256 queued inputs, one input per forward pass: of two 256-input calls sent together,
    the second finds the fill-mask queue full (as FillMask's own test in test_overload_doors.py)."""
    srv = await start_server(
        fill_models_root, compute_workers=1, embed_max_batch_size=1, embed_max_wait_ms=0.0, embed_max_queue=256
    )
    labels = {
        "service": "GRPCInferenceService",
        "method": "ModelInfer",
        "model": "tiny-fill-mask",
        "code": "RESOURCE_EXHAUSTED",
        "protocol": "http",
    }
    before = metric("ts_requests_total", labels)
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [256], "data": ["a [MASK] sat"] * 256}]}
    async with httpx.AsyncClient(base_url=srv.http_url, timeout=120) as http:
        replies = await asyncio.gather(*(http.post("/v2/models/tiny-fill-mask/infer", json=body) for _ in range(2)))
    assert sorted(r.status_code for r in replies) == [200, 429], [r.text[:200] for r in replies]
    refused = next(r for r in replies if r.status_code == 429).json()["error"]
    assert "tiny-fill-mask" in refused and "queue" in refused
    assert metric("ts_requests_total", labels) == before + 1


async def test_the_deadline_header_bounds_a_call(server, client):
    with pytest.raises(InferenceServerException) as caught:
        await client(
            "infer",
            "tiny-gpt",
            [text_input(TEXTS)],
            parameters={"max_new_tokens": 20},
            headers={"X-Request-Timeout": "1e-6"},
        )
    assert caught.value.status() == "504"
    with pytest.raises(InferenceServerException) as caught:
        await client("infer", "tiny-gpt", [text_input(TEXTS)], headers={"X-Request-Timeout": "soon"})
    assert caught.value.status() == "400" and "X-Request-Timeout" in caught.value.message()


async def test_grpc_and_rest_answer_alike(server, client):
    """tritonclient.grpc against the gRPC port and tritonclient.http against the HTTP port: one answer."""
    import tritonclient.grpc as triton_grpc

    grpc_client = triton_grpc.InferenceServerClient(server.address)
    try:
        for model, outputs in OUTPUTS.items():
            tensor = triton_grpc.InferInput("text", [len(MASKED)], "BYTES")
            tensor.set_data_from_numpy(np.array([t.encode() for t in MASKED], dtype=np.object_))
            over_grpc = await asyncio.to_thread(
                grpc_client.infer, model, [tensor], parameters={"seed": 1} if model == "tiny-gpt" else None
            )
            over_rest = await client(
                "infer", model, [text_input(MASKED)], parameters={"seed": 1} if model == "tiny-gpt" else None
            )
            for name in outputs:
                assert over_rest.as_numpy(name).tolist() == over_grpc.as_numpy(name).tolist(), (model, name)
    finally:
        grpc_client.close()
