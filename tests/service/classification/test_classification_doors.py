"""Converted cross-encoders and a classifier served through every door, against the source libraries.

The folders (tests/fixtures/classifiers.py: a BERT CrossEncoder folder with only a vocab.txt
tokenizer, an XLM-R CrossEncoder, a three-label BERT classifier) are loaded by
sentence-transformers' CrossEncoder and transformers on the same files; a real server over their
converted model directories answers gRPC Rerank / Classify, TEI /rerank and /predict, Cohere
/v1/rerank and /v2/rerank, vLLM /v1/score, /classify, KServe v2 REST, the Python client and the CLI.
"""

from __future__ import annotations

import asyncio
import json

import httpx2 as httpx
import numpy as np
import pytest
import torch
from sentence_transformers import CrossEncoder
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from client import AsyncClient
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.client.test_service_client import cli

QUERY = "Where did the little girl find the dragon?"
DOCS = [
    "Once upon a time, there was a little girl who loved books.",
    "The cat sat on the mat.",
    "She found a dragon in the castle near the forest.",
    "Überraschung! Ça coûte 12,50 € — naïve café.",
    "short",
]
ATOL = 1e-5


@pytest.fixture
async def srv(classifier_folders, start_server):
    return await start_server(classifier_folders / "models", default_classification_model="bert-ce")


def cross_encoder(classifier_folders, name: str) -> CrossEncoder:
    return CrossEncoder(str(classifier_folders / "hf" / name), local_files_only=True)


def reference_logits(classifier_folders, name: str, inputs: list) -> np.ndarray:
    folder = str(classifier_folders / "hf" / name)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    firsts = [x if isinstance(x, str) else x[0] for x in inputs]
    seconds = None if all(isinstance(x, str) for x in inputs) else [x[1] for x in inputs]
    with torch.no_grad():
        return model(**tok(firsts, seconds, padding=True, truncation=True, return_tensors="pt")).logits.numpy()


@pytest.mark.parametrize("name", ["bert-ce", "xlmr-ce"])
async def test_rerank_equals_cross_encoder_predict(name, classifier_folders, srv):
    want = cross_encoder(classifier_folders, name).predict([(QUERY, d) for d in DOCS])
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    reply = await stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, model=name, return_documents=True))
    assert [r.index for r in reply.results] == list(np.argsort(-want, kind="stable"))
    np.testing.assert_allclose([r.score for r in reply.results], np.sort(want)[::-1], atol=ATOL)
    assert [r.document for r in reply.results] == [DOCS[r.index] for r in reply.results]
    assert reply.model == name and reply.usage.input_tokens > 0
    raw = await stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, model=name, raw_scores=True, top_n=2))
    logits = cross_encoder(classifier_folders, name).predict(
        [(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity()
    )
    assert len(raw.results) == 2
    np.testing.assert_allclose([r.score for r in raw.results], [logits[r.index] for r in raw.results], atol=ATOL)


async def test_http_rerank_doors_equal_cross_encoder(classifier_folders, srv):
    want = cross_encoder(classifier_folders, "bert-ce").predict([(QUERY, d) for d in DOCS])
    best = list(np.argsort(-want, kind="stable"))
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        tei = (await c.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})).json()
        assert [r["index"] for r in tei] == best and [r["text"] for r in tei] == [DOCS[i] for i in best]
        np.testing.assert_allclose([r["score"] for r in tei], want[best], atol=ATOL)
        documents = [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]
        v1 = (await c.post("/v1/rerank", json={"query": QUERY, "documents": documents, "top_n": 3})).json()
        assert [r["index"] for r in v1["results"]] == best[:3]
        assert v1["results"][0]["document"] == {"text": DOCS[best[0]]} and v1["usage"]["total_tokens"] > 0
        np.testing.assert_allclose([r["relevance_score"] for r in v1["results"]], want[best[:3]], atol=ATOL)
        body = {"model": "bert-ce", "query": QUERY, "documents": DOCS, "top_n": 99}  # clamped to the count
        v2 = (await c.post("/v2/rerank", json=body)).json()
        assert [r["index"] for r in v2["results"]] == best and "document" not in v2["results"][0]
        score = (await c.post("/v1/score", json={"text_1": QUERY, "text_2": DOCS})).json()
        assert [d["index"] for d in score["data"]] == list(range(len(DOCS)))
        np.testing.assert_allclose([d["score"] for d in score["data"]], want, atol=ATOL)
        pairs = (await c.post("/v1/score", json={"text_1": [QUERY, DOCS[0]], "text_2": [DOCS[0], QUERY]})).json()
        swapped = cross_encoder(classifier_folders, "bert-ce").predict([(QUERY, DOCS[0]), (DOCS[0], QUERY)])
        np.testing.assert_allclose([d["score"] for d in pairs["data"]], swapped, atol=ATOL)


async def test_classify_equals_transformers_softmax(classifier_folders, srv):
    inputs = [DOCS[0], DOCS[1], (QUERY, DOCS[2])]
    singles = torch.softmax(torch.from_numpy(reference_logits(classifier_folders, "bert-cls3", inputs[:2])), -1)
    pair = torch.softmax(torch.from_numpy(reference_logits(classifier_folders, "bert-cls3", inputs[2:])), -1)
    want = np.concatenate([singles.numpy(), pair.numpy()])
    labels = ["negative", "neutral", "positive"]
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    request = pb.ClassifyRequest(
        model="bert-cls3",
        inputs=[
            pb.ClassifyInput(text=DOCS[0]),
            pb.ClassifyInput(text=DOCS[1]),
            pb.ClassifyInput(text=QUERY, text_pair=DOCS[2]),
        ],
    )
    reply = await stub.Classify(request)
    for row, result in zip(want, reply.results, strict=True):
        assert [s.label for s in result.labels] == [labels[i] for i in np.argsort(-row, kind="stable")]
        np.testing.assert_allclose(
            [row[s.label_id] for s in result.labels], [s.score for s in result.labels], atol=ATOL
        )
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        one = (await c.post("/predict", json={"model": "bert-cls3", "inputs": DOCS[0]})).json()
        assert [x["label"] for x in one] == [s.label for s in reply.results[0].labels]
        batch = (
            await c.post("/predict", json={"model": "bert-cls3", "inputs": [DOCS[0], DOCS[1], [QUERY, DOCS[2]]]})
        ).json()
        assert len(batch) == 3
        for row, got in zip(want, batch, strict=True):
            np.testing.assert_allclose(
                [row[labels.index(x["label"])] for x in got], [x["score"] for x in got], atol=ATOL
            )
        pair_only = (await c.post("/predict", json={"model": "bert-cls3", "inputs": [QUERY, DOCS[2]]})).json()
        np.testing.assert_allclose(sorted(x["score"] for x in pair_only), sorted(want[2]), atol=ATOL)
        infinity = (await c.post("/classify", json={"model": "bert-cls3", "input": [DOCS[1]]})).json()
        assert [x["label"] for x in infinity["data"][0]] == [x["label"] for x in batch[1]]
        np.testing.assert_allclose([x["score"] for x in infinity["data"][0]], [x["score"] for x in batch[1]], atol=1e-6)
        assert infinity["model"] == "bert-cls3"
        oip = await c.post(
            "/v2/models/bert-cls3/infer",
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": DOCS[:2]}]},
        )
        scores = next(o for o in oip.json()["outputs"] if o["name"] == "scores")
        np.testing.assert_allclose(np.reshape(scores["data"], scores["shape"]), want[:2], atol=ATOL)


@pytest.mark.parametrize("row_tokens", [128, 0])  # packed rows, padded rows
async def test_rerank_scores_do_not_depend_on_batch_neighbours(row_tokens, classifier_folders, start_server):
    """One call alone, then the same call among others of other lengths (batched together: a long
    batch wait): its scores do not change, packed or padded, and equal CrossEncoder's."""
    srv = await start_server(
        classifier_folders / "models",
        default_classification_model="bert-ce",
        embed_max_wait_ms=200,
        embed_pack_row_tokens=row_tokens,
    )
    info = await srv.models.GetModel(pb.GetModelRequest(name="bert-ce"))
    assert info.manifest["serving.execution"] == ("packed" if row_tokens else "padded")
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    request = pb.RerankRequest(query=QUERY, documents=DOCS)
    alone = await stub.Rerank(request)
    others = [pb.RerankRequest(query=" ".join(DOCS[: i + 1]) * (i + 1), documents=DOCS[i:]) for i in range(4)]
    crowd = await asyncio.gather(stub.Rerank(request), *(stub.Rerank(r) for r in others))
    assert [r.index for r in crowd[0].results] == [r.index for r in alone.results]
    np.testing.assert_allclose([r.score for r in crowd[0].results], [r.score for r in alone.results], atol=1e-6)
    want = cross_encoder(classifier_folders, "bert-ce").predict([(QUERY, d) for d in DOCS])
    np.testing.assert_allclose([r.score for r in alone.results], np.sort(want)[::-1], atol=ATOL)


async def test_python_client_and_cli(classifier_folders, srv):
    want = cross_encoder(classifier_folders, "bert-ce").predict([(QUERY, d) for d in DOCS[:3]])
    async with AsyncClient(srv.address) as client:
        ranked = await client.rerank(QUERY, DOCS[:3], top_n=1)
        labelled = await client.classify([DOCS[0], (QUERY, DOCS[1])], model="bert-cls3")
    assert ranked.results[0].index == int(np.argmax(want))
    assert [len(r.labels) for r in labelled.results] == [3, 3]
    code, out, err = await cli(srv.address, "rerank", QUERY, *DOCS[:3], "--top-n", "2")
    assert code == 0, err
    results = json.loads(out)["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable")[:2])
    assert results[0]["document"] == DOCS[results[0]["index"]]
    code, out, err = await cli(srv.address, "classify", DOCS[0], "--model", "bert-cls3")
    assert code == 0, err
    assert len(json.loads(out)["results"][0]["labels"]) == 3
    code, _, err = await cli(srv.address, "rerank", QUERY, DOCS[0], "--model", "bert-cls3")
    assert code == 2 and "INVALID_ARGUMENT" in err and "negative, neutral, positive" in err
