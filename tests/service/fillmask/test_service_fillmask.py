"""FillMaskService over a real server (tiny-fill-mask): results, pipeline semantics, batching, errors
(other doors and the shipped model: tests/service/fillmask/test_service_fillmask_doors.py).

The reference runs each text alone through the fp32 graph with onnxruntime and tokenizers, and
follows Hugging Face's fill-mask pipeline: softmax over the vocabulary at each mask, the top_k
tokens best first, `token` = decode([id]), `sequence` = the input with that mask filled (special
tokens skipped with one mask; with several, the other masks kept and [CLS]/[SEP] left out).
"""

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

from client import fill_mask_request
from service.fillmask.model import MAX_CANDIDATES, MAX_MASKS, MAX_TOP_K
from service.manifest import load_model_dir
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.fixtures.server import metric, status_of

MODEL = "tiny-fill-mask"
TEXTS = [
    "The cat sat on the [MASK].",
    "[MASK]",
    "a [MASK] b [MASK] c",
    "é ü [MASK] ß — unicode",
    "[MASK][MASK]",
    "x" * 36 + " [MASK] y",
]  # the last one: 46 tokens of the tiny model's 48


def reference(model_dir: Path, text: str, top_k: int) -> list[list[tuple[int, float, str, str]]]:
    """Per mask: (token_id, score, token, sequence) of the top_k candidates, computed on the text alone."""
    m = load_model_dir(model_dir).manifest
    session = ort.InferenceSession(str(model_dir / m.graph("encoder").file), providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(str(model_dir / m.tokenizer["file"]))
    tok.no_padding()
    tok.no_truncation()
    ids = tok.encode(text).ids
    feed = np.array([ids], dtype=np.int64)  # (1, T)
    (logits,) = session.run(["logits"], {"input_ids": feed, "attention_mask": np.ones_like(feed)})  # (1, T, V)
    special = m.special_tokens
    positions = [p for p, t in enumerate(ids) if t == special["mask"]]
    framing = {special["cls"], special["sep"], special["pad"]}
    out = []
    for p in positions:
        z = logits[0, p].astype(np.float64)
        probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()  # (V,)
        candidates = []
        for c in np.argsort(-probs, kind="stable")[:top_k].tolist():
            filled = [c if q == p else t for q, t in enumerate(ids)]
            if len(positions) == 1:
                sequence = tok.decode(filled, skip_special_tokens=True)
            else:
                sequence = tok.decode(
                    [t for q, t in enumerate(filled) if q in positions or t not in framing], skip_special_tokens=False
                )
            candidates.append((c, float(probs[c]), tok.decode([c], skip_special_tokens=False), sequence))
        out.append(candidates)
    return out


def flat(result: pb.FilledInput) -> list[list[tuple[int, float, str, str]]]:
    return [[(c.token_id, c.score, c.token, c.sequence) for c in mask.candidates] for mask in result.masks]


def assert_same(got: list, expected: list) -> None:
    assert [[c[0] for c in mask] for mask in got] == [[c[0] for c in mask] for mask in expected]
    assert [[c[2:] for c in mask] for mask in got] == [[c[2:] for c in mask] for mask in expected]
    np.testing.assert_allclose(
        [c[1] for mask in got for c in mask], [c[1] for mask in expected for c in mask], atol=1e-5
    )


async def test_fill_mask_matches_reference(start_server, fill_models_root, tiny_models_root):
    srv = await start_server(fill_models_root, variant="fp32")
    stub = pb_grpc.FillMaskServiceStub(srv.channel)
    response = await stub.FillMask(fill_mask_request(TEXTS, top_k=7))
    assert response.model == MODEL and len(response.results) == len(TEXTS)
    for text, result in zip(TEXTS, response.results, strict=True):
        assert_same(flat(result), reference(tiny_models_root / MODEL, text, 7))
    assert response.usage.input_tokens > len(TEXTS) and response.usage.output_tokens == 0
    assert response.timings.total_ms >= response.timings.inference_ms > 0


async def test_pipeline_semantics(start_server, fill_models_root):
    srv = await start_server(fill_models_root)
    stub = pb_grpc.FillMaskServiceStub(srv.channel)
    response = await stub.FillMask(fill_mask_request(["a [MASK] b [MASK] c [MASK]", "one [MASK]"]))
    assert [len(r.masks) for r in response.results] == [3, 1]  # one prediction list per mask, in order
    for result in response.results:
        for mask in result.masks:
            scores = [c.score for c in mask.candidates]
            assert len(scores) == 5  # top_k 0: 5
            assert scores == sorted(scores, reverse=True) and scores[-1] > 0 and sum(scores) <= 1 + 1e-6
            for c in mask.candidates:
                assert c.token in c.sequence
            if len(result.masks) > 1:  # each mask's candidates fill that mask only
                assert all(c.sequence.count("[MASK]") == len(result.masks) - 1 for c in mask.candidates)
    most = await stub.FillMask(fill_mask_request(["[MASK]"], top_k=MAX_TOP_K))
    scores = [c.score for c in most.results[0].masks[0].candidates]
    assert len(scores) == MAX_TOP_K and len({c.token_id for c in most.results[0].masks[0].candidates}) == MAX_TOP_K
    assert sum(scores) <= 1 + 1e-5


async def test_alone_and_in_a_crowd_give_the_same_results(start_server, fill_models_root):
    srv = await start_server(fill_models_root, embed_max_wait_ms=20.0)
    stub = pb_grpc.FillMaskServiceStub(srv.channel)
    alone = [flat((await stub.FillMask(fill_mask_request([t], top_k=10))).results[0]) for t in TEXTS]
    crowd = [f"{'w ' * (i % 9)}[MASK] {i}" for i in range(24)]
    calls = [stub.FillMask(fill_mask_request([t], top_k=10)) for t in TEXTS + crowd]
    together = await asyncio.gather(*calls)
    whole = await stub.FillMask(fill_mask_request(TEXTS + crowd, top_k=10))
    for i, expected in enumerate(alone):
        assert_same(flat(together[i].results[0]), expected)
        assert_same(flat(whole.results[i]), expected)


async def test_errors_say_what_and_why(start_server, fill_models_root):
    srv = await start_server(fill_models_root, embed_max_inputs=8)
    stub = pb_grpc.FillMaskServiceStub(srv.channel)

    async def call(inputs, **kwargs):
        return await status_of(stub.FillMask(fill_mask_request(inputs, **kwargs)))

    code, details = await call(["fine [MASK]", "no mask here"])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[1]" in details and "[MASK]" in details
    code, details = await call(["[MASK] " * (MAX_MASKS + 1)])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"limit is {MAX_MASKS}" in details
    code, details = await call(["x" * 60 + " [MASK]"])  # over 48 tokens: refused, never cut
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit of 48" in details and "never truncates" in details
    code, details = await call(["[MASK]"], top_k=MAX_TOP_K + 1)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"limit of {MAX_TOP_K}" in details
    code, details = await call(["[MASK]" * MAX_MASKS] * 3, top_k=MAX_TOP_K)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and str(MAX_CANDIDATES) in details
    code, details = await call([])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "inputs is empty" in details
    code, details = await call(["[MASK]"] * 9)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit is 8" in details
    code, details = await call(["a [MASK]", ""])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[1] is empty" in details
    code, details = await call(["[MASK]"], model="missing")
    assert code == grpc.StatusCode.NOT_FOUND and "tiny-fill-mask" in details
    code, details = await call(["[MASK]"], model="tiny-embed")  # as Embed treats a generation model's name
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "is a embedding model, not a fill-mask model" in details
    embed_code, _ = await status_of(srv.embedding.Embed(pb.EmbedRequest(inputs=["x"], model=MODEL)))
    assert embed_code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_bad_call_fails_alone(start_server, fill_models_root):
    srv = await start_server(fill_models_root, embed_max_wait_ms=20.0)
    stub = pb_grpc.FillMaskServiceStub(srv.channel)
    good = [stub.FillMask(fill_mask_request([f"good {i} [MASK]"])) for i in range(6)]
    bad = [
        stub.FillMask(fill_mask_request(["good [MASK]", "bad"])),
        stub.FillMask(fill_mask_request(["x" * 80 + "[MASK]"])),
    ]
    statuses = await asyncio.gather(*(status_of(c) for c in good + bad))
    assert [code for code, _ in statuses] == [grpc.StatusCode.OK] * 6 + [grpc.StatusCode.INVALID_ARGUMENT] * 2


async def test_queue_admission_and_deadlines_are_embeds(start_server, fill_models_root, monkeypatch):
    from tests.fixtures.server import until
    from tests.service.embedding.test_service_batching import BlockedExecutor
    from tests.service.test_service_admission import Exploding

    srv = await start_server(
        fill_models_root, compute_workers=1, embed_max_wait_ms=0.0, embed_max_queue=8, embed_max_inputs=8
    )
    stub, model = pb_grpc.FillMaskServiceStub(srv.channel), srv.server.registry.get("fill-mask")
    labels = {"model": MODEL}
    queued = metric("ts_queue_duration_seconds_count", labels)
    expired = metric("ts_dropped_items_total", {**labels, "reason": "expired"})
    async with BlockedExecutor(srv.server.runtime):
        first = stub.FillMask(fill_mask_request(["in the formed [MASK]"]))
        await until(lambda: metric("ts_queue_duration_seconds_count", labels) == queued + 1)  # the one slot is taken
        waiting = stub.FillMask(fill_mask_request([f"input {i} [MASK]" for i in range(4)]))
        await until(lambda: metric("ts_queue_depth", labels) == 4)
        late = stub.FillMask(fill_mask_request(["too late [MASK]"]), timeout=2.0)  # time to be queued on a busy CPU
        await until(lambda: metric("ts_queue_depth", labels) == 5)
        exploding = Exploding(RuntimeError("tokenized a call that should have been refused"))
        monkeypatch.setattr(model.tokenizer, "encode", exploding.encode)
        code, details = await status_of(stub.FillMask(fill_mask_request(["[MASK]"] * 5)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "5 of 8 queued inputs" in details
        assert exploding.calls == 0
        monkeypatch.undo()
        assert (await status_of(late))[0] == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server's deadline is the client's plus the call's transit: wait until the server has
        # given the call up too, or the unblocked batch may still (rightly) compute it.
        batcher = model.batcher
        await until(
            lambda: any(it.request.abandoned for it in batcher._queue), what="the server giving up the late call"
        )
    assert len((await first).results) == 1 and len((await waiting).results) == 4
    await until(lambda: metric("ts_dropped_items_total", {**labels, "reason": "expired"}) == expired + 1)


async def test_health_reflection_models_and_metrics(start_server, fill_models_root, embed_models_root):
    srv = await start_server(fill_models_root)
    health = health_pb2_grpc.HealthStub(srv.channel)
    check = await health.Check(health_pb2.HealthCheckRequest(service="inference.v1.FillMaskService"))
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(srv.channel)
    listed = [
        r async for r in reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    ]
    assert "inference.v1.FillMaskService" in {s.name for s in listed[0].list_services_response.service}
    info = await srv.models.GetModel(pb.GetModelRequest(name=MODEL))
    assert info.kind == "fill-mask" and info.is_default and info.vocab_size > MAX_TOP_K
    listed_models = await srv.models.ListModels(pb.ListModelsRequest())
    assert {m.name: m.kind for m in listed_models.models}[MODEL] == "fill-mask"
    ok = {"service": "FillMaskService", "method": "FillMask", "model": MODEL, "code": "OK", "protocol": "grpc"}
    calls, batches = metric("ts_requests_total", ok), metric("ts_batch_size_count", {"model": MODEL})
    await pb_grpc.FillMaskServiceStub(srv.channel).FillMask(fill_mask_request(["a [MASK]"]))
    assert metric("ts_requests_total", ok) == calls + 1
    assert metric("ts_batch_size_count", {"model": MODEL}) == batches + 1
    assert (
        metric(
            "ts_model_info",
            {
                "model": MODEL,
                "kind": "fill-mask",
                "provider": "CPUExecutionProvider",
                "variant": info.variant,
                "requested_provider": "CPUExecutionProvider",
            },
        )
        == 1
    )
    embed_only = await start_server(embed_models_root)
    check = await health_pb2_grpc.HealthStub(embed_only.channel).Check(
        health_pb2.HealthCheckRequest(service="inference.v1.FillMaskService")
    )
    assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
    code, details = await status_of(
        pb_grpc.FillMaskServiceStub(embed_only.channel).FillMask(fill_mask_request(["a [MASK]"]))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "no fill-mask model" in details


async def test_a_tokenizer_that_cannot_write_a_mask_is_refused_at_start(start_server, tiny_models_root, tmp_path):
    from tests.fixtures.models import copy_model_dir

    model_dir = copy_model_dir(tiny_models_root / MODEL, tmp_path)
    path = model_dir / "tokenizer.json"
    spec = json.loads(path.read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "[MASK]"]  # "[MASK]" now 6 bytes
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="does not encode the text '\\[MASK\\]' to the mask id"):
        await start_server(tmp_path, verify_hashes=False)
