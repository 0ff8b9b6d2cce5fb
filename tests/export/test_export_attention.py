"""The attention graphs (export/onnx/attention.py): parity with PyTorch, rows summing to 1, causal and
padding masks respected, gate figures in the manifest; the serving graphs unaffected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from export.gate import parity, rounding
from export.onnx import attention
from export.tiny import NAMES, byte_tokenizer, tiny_model
from service.manifest import load_model_dir

TEXTS = ["Hello world.", "The cat sat on the mat, then left.", "Ça coûte 12 €"]


def _rows(kind: str) -> list:
    """Right-padded batch rows of different lengths (pairs for a translator)."""
    tok = byte_tokenizer(kind)
    ids = [tok.encode(t).ids for t in TEXTS]
    if kind != "translation":
        return ids
    return [(s, [1, *t[: 3 + 4 * i]]) for i, (s, t) in enumerate(zip(ids, reversed(ids), strict=True))]


@pytest.mark.parametrize("kind", list(NAMES))
def test_manifest_records_the_gate(tiny_models_root, kind):
    m = load_model_dir(tiny_models_root / NAMES[kind]).manifest
    g = m.graph("attention")
    assert g.parity["attention_max_abs_diff"] <= g.parity["limit"] == rounding.float32_limit(g.parity["rounding_moved"])
    assert m.parity["thresholds"]["attention_max_abs"] == g.parity["limit"]
    assert g.parity["padded_key_max_weight"] == 0.0 and g.parity["row_sum_max_error"] < 1e-5
    assert m.parity["attention_max_abs_diff"] == g.parity["attention_max_abs_diff"]
    assert m.graphs[-1].role == "attention"  # after the serving graphs: their order is unchanged
    assert all(o.shape[:2] == ["batch", m.architecture["n_heads"]] for o in g.outputs)


@pytest.mark.parametrize("kind", list(NAMES))
def test_graph_matches_pytorch_and_respects_masks(tiny_models_root, kind):
    md = load_model_dir(tiny_models_root / NAMES[kind])
    model = tiny_model(kind, byte_tokenizer(kind).get_vocab_size())
    graph = md.manifest.graph("attention")
    sess = parity.session(md.file(graph.file))
    feeds = attention._feeds(model, _rows(kind))
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(names, feeds), strict=True))
    inputs = [torch.from_numpy(feeds[i.name]) for i in sess.get_inputs()]
    with torch.no_grad():
        if kind == "translation":  # encode + teacher-forced decode, three groups of maps
            ref = attention.TranslatorAttentionGraph(model)(*inputs)
        else:
            run = model.token_embeddings if kind == "embedding" else model
            blocks = model.encoder.blocks if kind == "fill-mask" else model.blocks
            ref = attention.recorded([[b.attn for b in blocks]], lambda: run(*inputs))
    assert len(ref) == len(names)
    for name, r in zip(names, ref, strict=True):
        g = got[name]  # (B, H, T, S)
        assert np.abs(g - r.numpy()).max() <= graph.parity["limit"], name
        np.testing.assert_allclose(g.sum(-1), 1.0, atol=1e-5)
        keys = attention._key_mask(name, feeds)  # (B, S)
        assert (g[np.broadcast_to(keys[:, None, None, :] == 0, g.shape)] == 0).all(), f"{name}: padding attended"
        if name.startswith("causal"):
            upper = np.triu(np.ones(g.shape[-2:], bool), k=1)
            assert (g[..., upper] == 0).all(), f"{name}: a query attends to a later position"


def test_graph_over_the_limit_is_left_out_not_the_build(tmp_path, monkeypatch):
    """A CPU whose fp32 rounding puts the attention graph over its limit still builds the model
    (the serving graphs passed their own gate); the directory just lacks the optional graph."""
    kind = "embedding"
    model = tiny_model(kind, byte_tokenizer(kind).get_vocab_size())
    monkeypatch.setattr(rounding, "EVALUATIONS", -1)  # a negative limit: every difference is over it
    graphs, figures = attention.attention_graph(model, tmp_path, [_rows(kind)])
    assert graphs == [] and not figures["ok"] and figures["attention_max_abs_diff"] >= 0.0
    assert not (tmp_path / attention.FILE).exists()
    monkeypatch.undo()
    graphs, figures = attention.attention_graph(model, tmp_path, [_rows(kind)])
    assert figures["ok"] and [g.role for g in graphs] == ["attention"]


def test_limit_is_what_float32_rounding_allows_and_a_fault_is_far_over_it(tmp_path):
    """The limit comes from the model (rounding noise on every inner product), not from one CPU's
    figures; a graph that no longer matches its model is still refused by far."""
    kind = "embedding"
    model = tiny_model(kind, byte_tokenizer(kind).get_vocab_size())
    rows = [_rows(kind)]
    _, figures = attention.attention_graph(model, tmp_path, rows)
    assert figures["ok"] and rounding.UNIT_ROUNDOFF < figures["limit"] < 1e-3
    with torch.no_grad():
        model.blocks[0].attn.query.weight *= 1.01  # a 1 % fault in one projection after the export
    fault = attention.attention_parity(model, tmp_path / attention.FILE, rows)
    assert not fault["ok"] and fault["attention_max_abs_diff"] > 10 * fault["limit"]
