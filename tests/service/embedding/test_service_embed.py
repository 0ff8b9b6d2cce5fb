"""EmbeddingService and ModelService over a real server (tiny-embed): results, streaming, errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tokenizers import Tokenizer

from client import AsyncClient, embed_request
from service.manifest import load_model_dir
from service.proto import inference_pb2 as pb
from tests.fixtures.models import copy_model_dir

TEXTS = ["hello", "a longer sentence with more words in it", "é ü ß — unicode", "x" * 30, "short one", "mid size text"]


def reference(model_dir: Path, texts: list[str]) -> np.ndarray:
    """Each text alone (no padding) through the fp32 graph with onnxruntime, then L2-normalised."""
    m = load_model_dir(model_dir).manifest
    session = ort.InferenceSession(str(model_dir / m.graph("encoder").file), providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(str(model_dir / m.tokenizer["file"]))
    tok.no_padding()
    tok.enable_truncation(m.max_input_tokens)
    rows = []
    for text in texts:
        ids = np.array([tok.encode(text).ids], dtype=np.int64)  # (1, T)
        (out,) = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        rows.append(out[0] / np.linalg.norm(out[0]))
    return np.stack(rows)


def as_array(response: pb.EmbedResponse) -> np.ndarray:
    return np.array([list(e.values) for e in response.embeddings], dtype=np.float32)


async def test_embed_matches_unpadded_reference(start_server, embed_models_root, tiny_models_root):
    srv = await start_server(embed_models_root, variant="fp32")
    response = await srv.embedding.Embed(embed_request(TEXTS, request_id="r1"))
    got = as_array(response)
    assert got.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(got, reference(tiny_models_root / "tiny-embed", TEXTS), atol=1e-5)
    assert response.model == "tiny-embed" and response.request_id == "r1"
    assert response.usage.input_tokens > len(TEXTS) and response.usage.output_tokens == 0
    assert response.timings.total_ms >= response.timings.inference_ms > 0


async def test_batched_and_single_identical(start_server, embed_models_root):
    srv = await start_server(embed_models_root)
    together = as_array(await srv.embedding.Embed(embed_request(TEXTS)))
    concurrent = await asyncio.gather(*(srv.embedding.Embed(embed_request([t])) for t in TEXTS))
    one_by_one = [await srv.embedding.Embed(embed_request([t])) for t in TEXTS]
    np.testing.assert_allclose(np.vstack([as_array(r) for r in concurrent]), together, atol=1e-6)
    np.testing.assert_allclose(np.vstack([as_array(r) for r in one_by_one]), together, atol=1e-6)


async def test_large_call_split_across_batches_keeps_order(start_server, embed_models_root):
    srv = await start_server(embed_models_root, embed_max_batch_size=3, embed_max_batch_tokens=64)
    texts = [f"{'word ' * (i % 7)}{i}" for i in range(20)]
    whole = as_array(await srv.embedding.Embed(embed_request(texts)))
    singles = np.vstack([as_array(await srv.embedding.Embed(embed_request([t]))) for t in texts])
    np.testing.assert_allclose(whole, singles, atol=1e-6)


async def test_normalize_and_dimensions(server):
    full = as_array(await server.embedding.Embed(embed_request(TEXTS[:2], normalize=False)))
    short = as_array(await server.embedding.Embed(embed_request(TEXTS[:2], dimensions=8)))
    raw_short = as_array(await server.embedding.Embed(embed_request(TEXTS[:2], dimensions=8, normalize=False)))
    assert not np.allclose(np.linalg.norm(full, axis=1), 1.0)
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-6)
    np.testing.assert_allclose(raw_short, full[:, :8], atol=1e-6)


async def test_embed_stream_in_order(server):
    requests = [embed_request([t], request_id=str(i)) for i, t in enumerate(TEXTS)]
    responses = [r async for r in server.embedding.EmbedStream(iter(requests))]
    assert [r.request_id for r in responses] == [str(i) for i in range(len(TEXTS))]
    together = as_array(await server.embedding.Embed(embed_request(TEXTS)))
    np.testing.assert_allclose(np.vstack([as_array(r) for r in responses]), together, atol=1e-6)


async def test_models_and_get_model(server, tiny_models_root):
    manifest = load_model_dir(tiny_models_root / "tiny-embed").manifest
    int8_ok = all(within_documented_limits(g.parity["quality"]) for g in manifest.graphs if g.variant == "int8")
    listed = (await server.models.ListModels(pb.ListModelsRequest())).models
    by_name = {m.name: m for m in listed}
    assert set(by_name) >= {"tiny-embed", "tiny-gpt", "tiny-translate"}
    embed = await server.models.GetModel(pb.GetModelRequest(name="tiny-embed"))
    assert embed == by_name["tiny-embed"]
    assert embed.kind == "embedding" and embed.is_default and embed.embedding_dimension == 32
    # auto on a CPU: int8 when the gate's figures are within the limits, else the fused fp32 graph
    assert embed.execution_provider == "CPUExecutionProvider" and embed.variant == ("int8" if int8_ok else "optimized")
    assert embed.max_input_tokens == 48 and embed.vocab_size > 256 and "opset" in embed.manifest


def within_documented_limits(quality: dict) -> bool:
    """An encoder's int8 figures against docs/model-directory.md's limits (not the gate's verdict)."""
    return (
        quality["cos_min"] >= 0.98
        and quality["cos_mean"] >= 0.995
        and quality["similarity_spearman"] >= 0.99
        and quality["batch_max_abs_diff"] <= 1e-4
    )


@pytest.mark.parametrize("admitted", [True, False], ids=["admitted", "refused"])
async def test_auto_serves_int8_exactly_where_the_gate_admitted_it(start_server, tiny_models_root, tmp_path, admitted):
    model_dir = copy_model_dir(tiny_models_root / "tiny-embed", tmp_path)
    manifest = json.loads((model_dir / "model.json").read_text())
    for graph in manifest["graphs"]:
        if graph["variant"] == "int8":
            graph["parity"]["quality_ok"] = admitted
    (model_dir / "model.json").write_text(json.dumps(manifest))
    srv = await start_server(tmp_path)
    info = await srv.models.GetModel(pb.GetModelRequest(name="tiny-embed"))
    assert info.variant == ("int8" if admitted else "optimized")
    served = as_array(await srv.embedding.Embed(embed_request(TEXTS)))
    cosines = np.sum(served * reference(model_dir, TEXTS), axis=1)  # both L2-normalised
    assert cosines.min() >= (0.98 if admitted else 0.99999)  # int8 within its documented limit; fp32 exact


async def test_health_per_service_and_reflection(server):
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", "inference.v1.EmbeddingService", "inference.v1.ModelService"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    replies = [r async for r in stub.ServerReflectionInfo(iter([ask]))]
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"inference.v1.EmbeddingService", "inference.v1.ModelService", "grpc.health.v1.Health"} <= names


async def test_async_client(server):
    async with AsyncClient(server.address) as client:
        vectors = await client.embed(["hello"], dimensions=4)
        assert len(vectors) == 1 and len(vectors[0]) == 4
        assert await client.health() == "SERVING"
        assert "tiny-embed" in {m.name for m in await client.models()}


BAD_REQUESTS = [
    (pb.EmbedRequest(), grpc.StatusCode.INVALID_ARGUMENT, "inputs is empty"),
    (embed_request(["ok", ""]), grpc.StatusCode.INVALID_ARGUMENT, "inputs[1] is empty"),
    (embed_request(["x"] * 9), grpc.StatusCode.INVALID_ARGUMENT, "the limit is 8"),
    (embed_request(["word " * 40], truncate=False), grpc.StatusCode.INVALID_ARGUMENT, "inputs[0] is 202 tokens"),
    (
        embed_request(["word " * 100], truncate=False),
        grpc.StatusCode.INVALID_ARGUMENT,
        "inputs[0] is 500 characters, more than 48 tokens can hold",
    ),  # refused before tokenizing
    (embed_request(["a"], dimensions=33), grpc.StatusCode.INVALID_ARGUMENT, "dimensions=33"),
    (embed_request(["a"], model="nope"), grpc.StatusCode.NOT_FOUND, "unknown model 'nope'"),
    (embed_request(["a"], model="tiny-gpt"), grpc.StatusCode.INVALID_ARGUMENT, "is a generation model"),
]


@pytest.mark.parametrize("request_, code, words", BAD_REQUESTS, ids=[b[2] for b in BAD_REQUESTS])
async def test_bad_input_status(start_server, request_, code, words):
    srv = await start_server(embed_max_inputs=8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.embedding.Embed(request_)
    assert err.value.code() == code
    assert words in err.value.details()


async def test_truncation_is_not_an_error_by_default(server):
    long = as_array(await server.embedding.Embed(embed_request(["word " * 100])))
    cut = as_array(await server.embedding.Embed(embed_request(["word " * 100 + "tail"])))
    np.testing.assert_allclose(long, cut, atol=1e-6)  # both cut to the 48-token limit


async def test_get_model_errors(server):
    for name, code in (("", grpc.StatusCode.INVALID_ARGUMENT), ("missing", grpc.StatusCode.NOT_FOUND)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await server.models.GetModel(pb.GetModelRequest(name=name))
        assert err.value.code() == code
