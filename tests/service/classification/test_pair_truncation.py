"""A pair past the context, served as the folder cuts it: only_second keeps the query whole.

`bert-ce-os` is tests/fixtures/classifiers.py's bert-ce with `processing_kwargs` {"text": {"truncation":
"only_second"}} in its sentence_bert_config.json (sentence-transformers' CrossEncoder then cuts only
the document), converted; served beside bert-ce (the same weights, cut longest-first). A long query
with long documents: bert-ce-os's scores equal that CrossEncoder's and differ from bert-ce's; a query
that leaves its documents no room is refused naming it (bert-ce cuts it instead); truncate=false is
refused at the limit; a single long text is cut at its end on both.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import httpx2 as httpx
import numpy as np
import pytest
from sentence_transformers import CrossEncoder

from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.fixtures.models import cached_build
from tests.fixtures.server import status_of

QUERY = " ".join(["where did the little girl find the dragon in the castle near the forest"] * 2)  # 50 tokens
DOCS = [" ".join(f"word{i} castle dragon girl" for i in range(k, k + 30)) for k in range(3)]
HUGE_QUERY = " ".join(["castle dragon girl"] * 40)
ATOL = 1e-5


@pytest.fixture(scope="session")
def only_second(classifier_folders) -> Path:
    """hf/bert-ce-os (the CrossEncoder folder) and models/bert-ce-os (converted, fp32)."""
    from export.convert import convert
    from export.modeldir import source_hash

    def build(root: Path) -> None:
        folder = root / "hf" / "bert-ce-os"
        shutil.copytree(classifier_folders / "hf" / "bert-ce", folder)
        path = folder / "sentence_bert_config.json"
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "processing_kwargs": {"text": {"truncation": "only_second"}}}))
        convert(folder, root / "models" / "bert-ce-os", name="bert-ce-os")

    key = "pairtrunc-" + source_hash(salt=f"only_second v1 {classifier_folders.name}")[:16]
    return cached_build(key, ["models/bert-ce-os"], build)


@pytest.fixture
async def srv(classifier_folders, only_second, start_server, tmp_path):
    for name, where in (("bert-ce", classifier_folders), ("bert-ce-os", only_second)):
        (tmp_path / name).symlink_to(where / "models" / name, target_is_directory=True)
    return await start_server(tmp_path, default_classification_model="bert-ce-os")


async def rerank(srv, model: str, query: str, **fields) -> list[float]:
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    reply = await stub.Rerank(pb.RerankRequest(query=query, documents=DOCS, model=model, **fields))
    return [s for _, s in sorted((r.index, r.score) for r in reply.results)]  # in document order


async def test_only_second_keeps_the_query_as_cross_encoder_does(only_second, srv):
    want = CrossEncoder(str(only_second / "hf" / "bert-ce-os"), local_files_only=True).predict(
        [(QUERY, d) for d in DOCS]
    )
    got = await rerank(srv, "bert-ce-os", QUERY)
    np.testing.assert_allclose(got, want, atol=ATOL)
    longest_first = await rerank(srv, "bert-ce", QUERY)  # same weights, the query cut too
    assert np.abs(np.asarray(longest_first) - want).max() > 1e-3
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        tei = (await c.post("/rerank", json={"query": QUERY, "texts": DOCS})).json()
    np.testing.assert_allclose([x["score"] for x in sorted(tei, key=lambda x: x["index"])], want, atol=ATOL)


async def test_a_query_that_leaves_no_room_is_refused_naming_it(srv):
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    code, details = await status_of(stub.Rerank(pb.RerankRequest(query=HUGE_QUERY, documents=DOCS)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "documents[0]: its first text (the query)" in details and "only_second" in details
    assert len(await rerank(srv, "bert-ce", HUGE_QUERY)) == len(DOCS)  # longest-first cuts the query
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        r = await c.post("/v1/rerank", json={"query": HUGE_QUERY, "documents": DOCS})
        pairs = await c.post("/predict", json={"inputs": [["short", "text"], [HUGE_QUERY, DOCS[0]]]})
    assert r.status_code == 400 and "shorten the query" in r.text
    assert pairs.status_code == 400 and "inputs[1]: its first text" in pairs.text


async def test_truncate_false_refuses_a_pair_past_the_limit(srv):
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    code, details = await status_of(stub.Rerank(pb.RerankRequest(query=QUERY, documents=DOCS, truncate=False)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "over this model's limit of 64" in details
    async with httpx.AsyncClient(base_url=srv.http_url) as c:
        r = await c.post("/rerank", json={"query": QUERY, "texts": DOCS, "truncate": False})
    assert r.status_code == 400 and "set truncate=true" in r.text


async def test_a_single_long_text_is_cut_at_its_end_on_both(srv):
    stub = pb_grpc.ClassificationServiceStub(srv.channel)
    request = pb.ClassifyRequest(inputs=[pb.ClassifyInput(text=HUGE_QUERY), pb.ClassifyInput(text=DOCS[0])])
    models = ("bert-ce", "bert-ce-os")
    replies = [await stub.Classify(pb.ClassifyRequest(inputs=request.inputs, model=m)) for m in models]
    scores = [[r.labels[0].score for r in reply.results] for reply in replies]
    assert replies[0].usage.input_tokens == replies[1].usage.input_tokens
    np.testing.assert_allclose(scores[0], scores[1], atol=1e-6)
