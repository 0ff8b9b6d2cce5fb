"""Packed encoder batches (several inputs per row): the same results as padded batches and as alone.

Real servers over the tiny embedding and fill-mask directories, one packed (the default) and one
padded (`embed_pack_row_tokens=0`); mixed lengths, inputs at the truncation limit, a batch of one.
The export gate is shown refusing a packed graph whose attention leaks across inputs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from export.gate import parity
from export.models import layers
from export.onnx import packed
from export.tiny import build_tiny
from service.engine.packing import pack, pool
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.fixtures.server import metric

TEXTS = [
    "a",
    "short one",
    "a somewhat longer sentence to embed, with punctuation and numbers 12,345!",
    "ünïcödé ✓ 東京",
    "x " * 200,
    "two words",
    "The cat sat on the mat while the dog slept by the fire.",
]


def test_pack_places_every_input_once_within_its_row():
    seqs = [[1] * n for n in (5, 3, 9, 1, 4, 7)]
    p = pack(seqs, 10, pad_id=0)
    assert p.input_ids.shape[1] == 10 and (p.segment_ids > 0).sum() == sum(map(len, seqs))
    for i, s in enumerate(seqs):
        r, a = p.row[i], p.start[i]
        assert p.position_ids[r, a : a + len(s)].tolist() == list(range(len(s)))
        assert len(set(p.segment_ids[r, a : a + len(s)].tolist())) == 1
    hidden = np.random.default_rng(0).normal(size=(*p.input_ids.shape, 3)).astype(np.float32)
    means = pool(hidden, p, "mean")
    for i, s in enumerate(seqs):
        assert np.allclose(means[i], hidden[p.row[i], p.start[i] : p.start[i] + len(s)].mean(0), atol=1e-6)
    assert np.allclose(pool(hidden, p, "cls")[2], hidden[p.row[2], p.start[2]])
    longer = pack([[1] * 30, [2] * 3], 10, pad_id=0)  # longer than a row: a row of its own length
    assert longer.input_ids.shape == (2, 30)


async def embed(server, texts):
    reply = await server.embedding.Embed(pb.EmbedRequest(model="tiny-embed", inputs=texts))
    return np.array([list(e.values) for e in reply.embeddings], np.float32)


async def test_packed_equals_padded_and_alone(embed_models_root, start_server):
    packed_server = await start_server(embed_models_root)
    padded_server = await start_server(embed_models_root, embed_pack_row_tokens=0)
    together = await embed(packed_server, TEXTS)
    alone = np.concatenate([await embed(packed_server, [t]) for t in TEXTS])
    padded = await embed(padded_server, TEXTS)
    assert np.abs(together - alone).max() <= 1e-5
    cos = (together * padded).sum(-1)
    assert cos.min() >= 0.99999, cos
    info = await packed_server.models.ListModels(pb.ListModelsRequest())
    padded_info = await padded_server.models.ListModels(pb.ListModelsRequest())
    assert info.models[0].manifest["serving.execution"] == "packed"
    assert padded_info.models[0].manifest["serving.execution"] == "padded"
    assert metric("ts_batch_padding_ratio_count", {"model": "tiny-embed"}) > 0


async def test_fill_mask_packed_equals_padded(fill_models_root, start_server):
    texts = ["The cat sat on the [MASK].", "[MASK]", "a [MASK] b [MASK] and a tail", "x y [MASK] z"]
    results = []
    for overrides in ({}, {"embed_pack_row_tokens": 0}):
        server = await start_server(fill_models_root, **overrides)
        stub = pb_grpc.FillMaskServiceStub(server.channel)
        reply = await stub.FillMask(pb.FillMaskRequest(model="tiny-fill-mask", inputs=texts, top_k=5))
        alone = [await stub.FillMask(pb.FillMaskRequest(model="tiny-fill-mask", inputs=[t], top_k=5)) for t in texts]
        rows = [[(c.token_id, round(c.score, 5)) for m in r.masks for c in m.candidates] for r in reply.results]
        assert rows == [
            [(c.token_id, round(c.score, 5)) for m in a.results[0].masks for c in m.candidates] for a in alone
        ]
        results.append(rows)
    assert [[t for t, _ in r] for r in results[0]] == [[t for t, _ in r] for r in results[1]]
    assert np.allclose([s for r in results[0] for _, s in r], [s for r in results[1] for _, s in r], atol=1e-4)


async def test_a_directory_without_a_packed_graph_serves_padded(embed_models_root, tmp_path, start_server):
    old = tmp_path / "tiny-embed"
    shutil.copytree(embed_models_root / "tiny-embed", old)
    manifest = json.loads((old / "model.json").read_text())
    manifest["graphs"] = [g for g in manifest["graphs"] if g["role"] != "packed"]
    (old / "model.json").write_text(json.dumps(manifest))
    (old / "packed.onnx").unlink()
    server = await start_server(tmp_path)
    info = await server.models.ListModels(pb.ListModelsRequest())
    assert info.models[0].manifest["serving.execution"] == "padded"
    assert np.isfinite(await embed(server, TEXTS)).all()


def test_the_gate_refuses_a_packed_graph_that_attends_across_inputs(monkeypatch, tmp_path):
    def leaky(segment_ids):  # every real token sees every real token of its row
        return (segment_ids[:, None, :] > 0)[:, :, None, :].expand(-1, 1, segment_ids.shape[1], -1)

    monkeypatch.setattr(layers, "same_segment", leaky)
    with pytest.raises(parity.ParityError, match="packed"):
        build_tiny("embedding", tmp_path / "leaky")
    assert not (tmp_path / "leaky").exists()


def test_the_manifest_records_the_packed_gate(embed_models_root):
    manifest = json.loads((Path(embed_models_root) / "tiny-embed" / "model.json").read_text())
    graph = next(g for g in manifest["graphs"] if g["role"] == "packed" and g["variant"] == "fp32")
    figures = graph["parity"]["packed"]
    assert figures["cos_min"] >= parity.ENCODER_MIN_COS and figures["alone_max_abs_diff"] <= parity.LOGITS_MAX_ABS


def test_an_int8_graph_packed_among_others_computes_what_it_computes_alone(embed_models_root):
    """int8 rounding amplifies the SIMD grouping of a row's softmax sums unless inputs start aligned."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from service.engine.packing import alignment

    d = Path(embed_models_root) / "tiny-embed"
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(48)
    words = ["ka", "lomi", "ter", "anso", "veri", "pu", "denol", "ish"]
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=rng.integers(3, 20))) for _ in range(256)]
    seqs = [e.ids for e in tok.encode_batch(texts)]
    sess = ort.InferenceSession(str(d / "packed.int8.onnx"), providers=["CPUExecutionProvider"])
    together = np.concatenate(
        [packed.embed(sess, seqs[i : i + 32], 0, "mean", 128, alignment("int8")) for i in range(0, len(seqs), 32)]
    )
    alone = np.concatenate([packed.embed(sess, [s], 0, "mean", 128, alignment("int8")) for s in seqs])
    assert np.abs(together - alone).max() == 0.0
