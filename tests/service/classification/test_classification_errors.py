"""Bad input, limits and overload of rerank and classify, at the gRPC and HTTP doors.

Empty query or documents, a blank document, top_n 0, a three-label classifier asked to rerank (its
labels named), a pair past the context with truncate false (refused) or true (cut as the source
library cuts it), too many documents or inputs (the settings named), a call larger than the queue
(INVALID_ARGUMENT), a full queue (RESOURCE_EXHAUSTED / 429 at once), and health and reflection naming the new service.
"""

from __future__ import annotations

import grpc
import httpx2 as httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sentence_transformers import CrossEncoder

from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.fixtures.server import metric, status_of, until
from tests.service.embedding.test_service_batching import BlockedExecutor

LONG = " ".join(f"word{i} castle dragon girl" for i in range(80))


@pytest.fixture
async def srv(classifier_folders, start_server):
    return await start_server(
        classifier_folders / "models",
        default_classification_model="bert-ce",
        rerank_max_documents=6,
        classify_max_inputs=3,
        embed_max_queue=4,
        embed_max_inputs=4,
        compute_workers=1,
    )


BAD_RERANKS = [
    (dict(query="", documents=["a"]), "query is empty"),
    (dict(query="  ", documents=["a"]), "query is empty"),
    (dict(query="q", documents=[]), "documents is empty"),
    (dict(query="q", documents=["a", " "]), "documents[1] is empty"),
    (dict(query="q", documents=["a"], top_n=0), "top_n=0"),
    (dict(query="q", documents=["a"] * 7), "rerank_max_documents"),
    (dict(query="q", documents=["a"] * 5), "needs 5 places; the classification queue of model 'bert-ce' holds 4"),
    (dict(query="q", documents=["a"], model="bert-cls3"), "3 labels (negative, neutral, positive)"),
    (dict(query="q", documents=[LONG], truncate=False), "over this model's limit of 64"),
]


@pytest.mark.parametrize("fields, message", BAD_RERANKS)
async def test_bad_rerank_is_invalid_argument_at_both_doors(fields, message, srv):
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    code, details = await status_of(stub.Rerank(pb.RerankRequest(**fields)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    body = {"query": fields["query"], "documents": fields["documents"], "model": fields.get("model")}
    body |= {k: fields[k] for k in ("top_n", "truncate") if k in fields}
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        reply = await c.post("/v1/rerank", json=body)
    assert reply.status_code == 400 and message in reply.json()["error"]["message"]


async def test_bad_classify_and_score(srv):
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    for inputs, message in [
        ([], "inputs is empty"),
        ([pb.ClassifyInput(text="")], "inputs[0] is empty"),
        ([pb.ClassifyInput(text="a", text_pair=" ")], "inputs[0] text pair is empty"),
        ([pb.ClassifyInput(text="a")] * 4, "classify_max_inputs"),
    ]:
        code, details = await status_of(stub.Classify(pb.ClassifyRequest(inputs=inputs, model="bert-cls3")))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        for path, body, message in [
            ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1 has 2 texts and text_2 3"),
            ("/predict", {"inputs": [["a", "b", "c"], "d"]}, "inputs[0] must be a text or a pair"),
            ("/predict", {"inputs": 3}, "inputs must be a text"),
            ("/rerank", {"query": "q", "texts": "not a list"}, None),
            ("/v2/rerank", {"query": "q", "documents": [{"txt": "a"}]}, "documents[0]"),
            ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": "2"}, "top_n must be an integer"),
        ]:
            reply = await c.post(path, json=body)
            if message is None:  # a single string is one text (TEI reads `texts` as strings)
                assert reply.status_code == 200
                continue
            assert reply.status_code == 400 and message in reply.json()["error"]["message"], reply.text


async def test_http_arrays_over_the_limit_are_refused_before_their_elements_are_read(srv):
    """Elements that are not even text: the array's length is refused first, naming the setting."""
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        for path, body, setting in [
            ("/rerank", {"query": "q", "texts": [1] * 7}, "rerank_max_documents"),
            ("/v1/rerank", {"query": "q", "documents": [1] * 7}, "rerank_max_documents"),
            ("/v2/rerank", {"query": "q", "documents": [{}] * 7}, "rerank_max_documents"),
            ("/v1/score", {"text_1": "q", "text_2": [1] * 7}, "rerank_max_documents"),
            ("/predict", {"inputs": [1] * 4}, "classify_max_inputs"),
            ("/classify", {"input": [1] * 4}, "classify_max_inputs"),
        ]:
            reply = await c.post(path, json=body)
            message = reply.json()["error"]["message"]
            assert reply.status_code == 400 and "elements; one call takes at most" in message, reply.text
            assert setting in message


async def test_a_pair_past_the_context_is_cut_as_the_source_library_cuts_it(classifier_folders, srv):
    docs = [LONG, "The cat sat on the mat."]
    folder = str(classifier_folders / "hf" / "bert-ce")
    want = CrossEncoder(folder, local_files_only=True, max_length=64).predict([(LONG, d) for d in docs])
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    reply = await stub.Rerank(pb.RerankRequest(query=LONG, documents=docs))
    got = {r.index: r.score for r in reply.results}
    np.testing.assert_allclose([got[0], got[1]], want, atol=1e-5)
    assert reply.usage.input_tokens == 2 * 64


async def test_a_full_queue_is_refused_at_once(srv):
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    model = {"model": "bert-ce"}
    queued = metric("ts_queue_duration_seconds_count", model)
    async with BlockedExecutor(srv.server.runtime):
        first = stub.Rerank(pb.RerankRequest(query="q", documents=["in the formed batch"]))
        await until(lambda: metric("ts_queue_duration_seconds_count", model) == queued + 1)
        waiting = stub.Rerank(pb.RerankRequest(query="q", documents=["a", "b", "c", "d"]))
        await until(lambda: metric("ts_queue_depth", model) == 4)
        code, details = await status_of(stub.Rerank(pb.RerankRequest(query="q", documents=["one more"])))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "is full" in details
        async with httpx.AsyncClient(base_url=srv.http_url) as c:
            reply = await c.post("/rerank", json={"query": "q", "texts": ["one more"]})
        assert reply.status_code == 429
    assert len((await first).results) == 1 and len((await waiting).results) == 4


async def test_health_and_reflection_name_the_service(srv):
    name = "inference.v1.ClassificationService"
    health = health_pb2_grpc.HealthStub(srv.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(srv.channel)
    async for answer in reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
        assert name in [s.name for s in answer.list_services_response.service]


async def test_attention_inspection_reads_a_classifier(srv):
    reply = await srv.inspection.Attention(pb.AttentionRequest(model="bert-ce", text="the cat sat", layers=[0]))
    assert reply.maps and all(m.layer == 0 for m in reply.maps)
