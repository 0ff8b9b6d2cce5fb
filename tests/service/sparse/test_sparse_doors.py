"""A converted SPLADE folder served through every door, against sentence-transformers' SparseEncoder.

The folder (tests/fixtures/sparse.py: a SparseEncoder of a tiny BertForMaskedLM with SpladePooling
max and a "query" prompt) is loaded by `SparseEncoder` from the same files; a real server over its
model directory and tiny-embed (a dense embedder) answers gRPC EmbedSparse (and the Python client and CLI), TEI
/embed_sparse and /embed, and KServe v2 REST. Sparse vectors: the same non-zero indices and values within 1e-4 (fp32
sums in two orders; log1p of a logit is at most as far apart as the logits). A sparse request to the
dense model, and a dense one to the sparse model, are refused naming the model's kind.
"""

from __future__ import annotations

import itertools
import json

import grpc
import httpx2 as httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sentence_transformers import SparseEncoder

from client import AsyncClient
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.sparse.core import sparse_rows
from tests.client.test_service_client import cli
from tests.fixtures.server import status_of

TEXTS = [
    "Once upon a time, there was a little girl who loved books.",
    "The cat sat on the mat.",
    "Überraschung! Ça coûte 12,50 € — naïve café.",
    "short",
]
ATOL = 1e-4
LONG = " ".join(f"word{i} castle dragon girl" for i in range(80))


@pytest.fixture
async def srv(sparse_models_root, start_server):
    return await start_server(sparse_models_root)


def reference(sparse_folders, texts: list[str], **kwargs) -> list[tuple[list[int], np.ndarray]]:
    """(non-zero indices, their values) per text, from SparseEncoder.encode on the source folder."""
    model = SparseEncoder(str(sparse_folders / "hf" / "splade"), local_files_only=True)
    dense = model.encode(texts, convert_to_sparse_tensor=False, **kwargs).cpu().numpy()  # (N, V)
    return [(np.flatnonzero(row).tolist(), row[np.flatnonzero(row)]) for row in dense]


def assert_same(got: list[tuple[list[int], list[float]]], want) -> None:
    assert len(got) == len(want)
    for (indices, values), (want_indices, want_values) in zip(got, want, strict=True):
        assert indices == want_indices
        np.testing.assert_allclose(values, want_values, atol=ATOL)


async def test_grpc_embed_sparse_equals_sparse_encoder(sparse_folders, srv):
    stub = pb_grpc.SparseEmbeddingServiceStub(srv.channel)
    reply = await stub.EmbedSparse(pb.EmbedSparseRequest(inputs=TEXTS, request_id="r1"))
    assert reply.model == "splade" and reply.request_id == "r1" and reply.usage.input_tokens > len(TEXTS)
    assert_same([(list(e.indices), list(e.values)) for e in reply.embeddings], reference(sparse_folders, TEXTS))
    queried = await stub.EmbedSparse(pb.EmbedSparseRequest(inputs=TEXTS[:2], prompt_name="query"))
    want = reference(sparse_folders, TEXTS[:2], prompt_name="query")
    assert_same([(list(e.indices), list(e.values)) for e in queried.embeddings], want)
    assert [list(e.indices) for e in queried.embeddings] != [w[0] for w in reference(sparse_folders, TEXTS[:2])]


async def test_python_client_embed_sparse(sparse_folders, srv):
    async with AsyncClient(srv.address) as client:
        reply = await client.embed_sparse(TEXTS[:2], prompt_name="query")
    want = reference(sparse_folders, TEXTS[:2], prompt_name="query")
    assert_same([(list(e.indices), list(e.values)) for e in reply.embeddings], want)


async def test_cli_embed_sparse(sparse_folders, srv):
    code, out, err = await cli(srv.address, "embed-sparse", *TEXTS[:2], "--prompt-name", "query")
    assert code == 0, err
    rows = [(e["indices"], e["values"]) for e in json.loads(out)["embeddings"]]
    assert_same(rows, reference(sparse_folders, TEXTS[:2], prompt_name="query"))
    code, out, err = await cli(srv.address, "embed-sparse", "a", "--model", "tiny-embed")
    assert code == 2 and "INVALID_ARGUMENT" in err and "is a embedding model" in err


async def test_tei_embed_sparse_equals_sparse_encoder(sparse_folders, srv):
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        rows = (await c.post("/embed_sparse", json={"inputs": TEXTS})).json()
        single = (await c.post("/embed_sparse", json={"inputs": TEXTS[1], "prompt_name": "query"})).json()
    assert_same([([x["index"] for x in r], [x["value"] for x in r]) for r in rows], reference(sparse_folders, TEXTS))
    want = reference(sparse_folders, TEXTS[1:2], prompt_name="query")
    assert_same([([x["index"] for x in r], [x["value"] for x in r]) for r in single], want)


async def test_kserve_rest_gives_compressed_rows(sparse_folders, srv):
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        meta = (await c.get("/v2/models/splade")).json()
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
        out = {o["name"]: o for o in (await c.post("/v2/models/splade/infer", json=body)).json()["outputs"]}
    assert {o["name"] for o in meta["outputs"]} == {"indices", "values", "offsets"}
    offsets, indices, values = out["offsets"]["data"], out["indices"]["data"], out["values"]["data"]
    rows = [(indices[a:b], values[a:b]) for a, b in itertools.pairwise(offsets)]
    assert_same(rows, reference(sparse_folders, TEXTS))


async def test_tei_embed_equals_openai_embeddings_on_a_dense_model(srv):
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        tei = (await c.post("/embed", json={"inputs": TEXTS, "model": "tiny-embed"})).json()
        openai = (await c.post("/v1/embeddings", json={"input": TEXTS, "model": "tiny-embed"})).json()
        raw = (await c.post("/embed", json={"inputs": TEXTS[0], "normalize": False, "dimensions": 8})).json()
    np.testing.assert_allclose(tei, [d["embedding"] for d in openai["data"]], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(tei, axis=1), 1.0, atol=1e-5)
    stub = pb_grpc.EmbeddingServiceStub(srv.channel)
    want = await stub.Embed(pb.EmbedRequest(inputs=TEXTS[:1], normalize=False, dimensions=8))
    assert len(raw) == 1 and len(raw[0]) == 8
    np.testing.assert_allclose(raw[0], want.embeddings[0].values, atol=1e-6)


async def test_the_wrong_kind_is_refused_naming_the_models_kind(srv):
    stub = pb_grpc.SparseEmbeddingServiceStub(srv.channel)
    code, details = await status_of(stub.EmbedSparse(pb.EmbedSparseRequest(inputs=["a"], model="tiny-embed")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "is a embedding model, not a sparse-embedding model" in details
    dense = pb_grpc.EmbeddingServiceStub(srv.channel)
    code, details = await status_of(dense.Embed(pb.EmbedRequest(inputs=["a"], model="splade")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "is a sparse-embedding model" in details
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        sparse_to_dense = await c.post("/embed_sparse", json={"inputs": "a", "model": "tiny-embed"})
        dense_to_sparse = await c.post("/embed", json={"inputs": "a", "model": "splade"})
    assert sparse_to_dense.status_code == 400 and "is a embedding model" in sparse_to_dense.text
    assert dense_to_sparse.status_code == 400 and "is a sparse-embedding model" in dense_to_sparse.text


BAD = [
    ({"inputs": []}, "inputs is empty"),
    ({"inputs": [1, 2]}, "inputs must be a string or an array of strings"),
    ({"inputs": LONG, "truncate": False}, "limit of 64"),
    ({"inputs": "a", "prompt_name": "nope"}, "is not a prompt of model 'splade'"),
    ({"inputs": "a", "truncation_direction": "Left"}, "only Right"),
]


@pytest.mark.parametrize("body, message", BAD)
async def test_bad_sparse_calls_are_400(body, message, srv):
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        r = await c.post("/embed_sparse", json=body)
    assert r.status_code == 400 and message in r.text, r.text


async def test_long_input_is_truncated_unless_told_not_to(sparse_folders, srv):
    stub = pb_grpc.SparseEmbeddingServiceStub(srv.channel)
    cut = await stub.EmbedSparse(pb.EmbedSparseRequest(inputs=[LONG]))
    assert cut.usage.input_tokens == 64
    assert_same([(list(cut.embeddings[0].indices), list(cut.embeddings[0].values))], reference(sparse_folders, [LONG]))
    code, details = await status_of(stub.EmbedSparse(pb.EmbedSparseRequest(inputs=[LONG], truncate=False)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit of 64" in details


async def test_health_names_the_sparse_service(srv):
    health = health_pb2_grpc.HealthStub(srv.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="inference.v1.SparseEmbeddingService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_sparse_rows_keep_each_rows_non_zero_entries_an_empty_row_included():
    weights = np.array([[0, 1.5, 0, 2], [0, 0, 0, 0], [3, 0, 0, 0]], dtype=np.float32)
    rows = sparse_rows(weights)
    assert [r.indices.tolist() for r in rows] == [[1, 3], [], [0]]
    assert [r.values.tolist() for r in rows] == [[1.5, 2.0], [], [3.0]]
