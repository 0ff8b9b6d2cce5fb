"""Tiny random-weight models of each kind export, pass the parity gate, and load without torch.

The gate itself is exercised too: a graph that does not compute what the model computes must be
refused (`ParityError`), so the gate is not a rubber stamp.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export.gate import parity
from export.onnx.graphs import export_decoder, export_encoder
from export.tiny import NAMES, byte_tokenizer, tiny_model
from service.manifest import ROLES, load_model_dir

KINDS = list(NAMES)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_dirs_are_complete_and_verified(tiny_models_root, kind):
    md = load_model_dir(tiny_models_root / NAMES[kind])
    m = md.manifest
    assert m.kind == kind and m.name == NAMES[kind]
    for role in ROLES[kind]:
        assert "fp32" in m.variants(role) and "optimized" in m.variants(role)
    assert m.versions["onnxruntime"] and m.opset == 17
    assert m.extra["tiny"] is True
    assert (md.path / "tokenizer.json").is_file()


def test_tiny_gate_figures_recorded(tiny_models_root):
    gpt = load_model_dir(tiny_models_root / "tiny-gpt").manifest
    assert gpt.parity["greedy_identical"] and gpt.parity["greedy_new_tokens"] >= 64
    assert gpt.parity["prefill_max_abs_diff"] <= 1e-4 and gpt.parity["decode_max_abs_diff"] <= 1e-4
    assert min(gpt.parity["decode_past_lengths"]) > 0
    tr = load_model_dir(tiny_models_root / "tiny-translate").manifest
    assert tr.parity["greedy_identical"] and tr.parity["cross_kv_max_abs_diff"] <= 1e-4
    emb = load_model_dir(tiny_models_root / "tiny-embed").manifest
    assert emb.parity["cos_min"] >= 0.99999
    assert set(emb.variants("encoder")) == {"fp32", "optimized", "fp16", "int8"}
    assert emb.graph("encoder", "int8").parity["cos_min"] >= 0.95


def test_decoder_graph_io_follows_the_kv_contract(tiny_models_root):
    m = load_model_dir(tiny_models_root / "tiny-gpt").manifest
    g = m.graph("decoder")
    names = [t.name for t in g.inputs]
    n = m.architecture["n_layers"]
    assert names[:5] == ["input_ids", "position_ids", "seqlens_k", "total_sequence_length", "logits_positions"]
    assert [(t.dtype, t.shape) for t in g.inputs[2:5]] == [
        ("int32", ["batch"]),
        ("int32", []),
        ("int64", ["batch", "logits_sequence"]),
    ]
    assert names[5:] == [f"past_key_values.{i}.{kv}" for i in range(n) for kv in ("key", "value")]
    presents = [f"present.{i}.{kv}" for i in range(n) for kv in ("key", "value")]
    assert [t.name for t in g.outputs] == ["logits", *presents]
    assert g.outputs[0].shape == ["batch", "logits_sequence", m.architecture["vocab_size"]]
    heads = m.architecture["n_heads"]
    buffer = ["batch", heads, "max_sequence", m.architecture["d_model"] // heads]
    assert g.inputs[5].shape == buffer and g.outputs[1].shape == buffer  # present is the past buffer
    assert m.format_version == 3


def test_no_if_node_and_prefill_with_empty_past(tiny_models_root):
    import onnx

    d = tiny_models_root / "tiny-gpt"
    graph = onnx.load(str(d / "decoder.onnx")).graph
    assert not [node for node in graph.node if node.op_type in ("If", "Loop")]
    tok = json.loads((d / "model.json").read_text())["special_tokens"]
    assert [node.domain for node in graph.node if node.op_type == "GroupQueryAttention"] == ["com.microsoft"] * 2
    step = parity.onnx_step(parity.session(d / "decoder.onnx"), max_length=32)
    ids = np.array([[tok["bos"], 70, 71]], dtype=np.int64)
    logits, (present, lengths) = step(ids, np.ones_like(ids), np.arange(3)[None, :], None)
    assert logits.shape[:2] == (1, 3) and present[0].shape[2] == 32 and lengths.tolist() == [3]
    assert np.abs(present[0][0, :, :3]).sum() > 0 and not present[0][0, :, 3:].any()  # slots 0-2 written


@pytest.mark.parametrize("variant", ["fp32", "optimized", "int8", "int4"])
def test_the_vocabulary_projection_runs_only_at_the_positions_asked(tiny_models_root, variant):
    """A right-padded prefill of two rows asking for each row's last token returns exactly those
    positions' logits of the same prefill asking for every position; a pass asking for a position
    twice and out of order gets it twice, in that order."""
    d = tiny_models_root / "tiny-gpt"
    manifest = load_model_dir(d).manifest
    if variant not in manifest.variants("decoder"):
        pytest.skip(f"tiny-gpt has no {variant} decoder")
    sess = parity.session(d / manifest.graph("decoder", variant).file)
    kv = next(i for i in sess.get_inputs() if i.name.startswith("past_key_values."))
    lengths = np.asarray([6, 3])
    ids = np.asarray([[1, 70, 71, 72, 73, 74], [1, 80, 81, 0, 0, 0]], np.int64)

    def run(at: np.ndarray) -> np.ndarray:
        feeds = {
            "input_ids": ids,
            "position_ids": np.broadcast_to(np.arange(6), ids.shape).copy(),
            "seqlens_k": (lengths - 1).astype(np.int32),
            "total_sequence_length": np.asarray(6, np.int32),
            "logits_positions": at.astype(np.int64),
        }
        for i in sess.get_inputs():
            if i.name.startswith("past_key_values."):
                feeds[i.name] = np.zeros((2, kv.shape[1], 16, kv.shape[3]), np.float32)
        return sess.run(["logits"], feeds)[0]

    every = run(np.broadcast_to(np.arange(6), (2, 6)))
    last = run((lengths - 1)[:, None])
    assert every.shape[:2] == (2, 6) and last.shape[:2] == (2, 1)
    np.testing.assert_allclose(last[:, 0], every[[0, 1], lengths - 1], rtol=0, atol=1e-5)
    picked = run(np.asarray([[5, 0, 5], [2, 2, 1]]))
    np.testing.assert_allclose(picked, every[[[0], [1]], [[5, 0, 5], [2, 2, 1]]], rtol=0, atol=1e-5)


def test_tokenizers_round_trip_and_add_special_tokens():
    for kind in KINDS:
        tok = byte_tokenizer(kind)
        text = "Ça coûte 12 € — 東京"
        assert tok.decode(tok.encode(text).ids) == text
    assert byte_tokenizer("embedding").encode("a").tokens == ["[CLS]", "a", "[SEP]"]
    assert byte_tokenizer("translation").encode("a").tokens == ["a", "</s>"]


def test_gate_refuses_a_wrong_encoder_graph(tmp_path):
    tok = byte_tokenizer("embedding")
    model = tiny_model("embedding", tok.get_vocab_size())
    export_encoder(model, tmp_path / "encoder.onnx")
    with torch.no_grad():
        model.blocks[-1].ln_ffn.bias.add_(torch.linspace(-1, 1, model.config.d_model))  # graph != model
    batch = [tok.encode("hello there").ids, tok.encode("a much longer sentence to embed").ids]
    with pytest.raises(parity.ParityError, match="cosine"):
        parity.encoder_parity(model, tmp_path / "encoder.onnx", [batch], pad_id=0)


def test_gate_refuses_a_wrong_decoder_graph(tmp_path):
    tok = byte_tokenizer("generation")
    model = tiny_model("generation", tok.get_vocab_size())
    export_decoder(model, tmp_path / "decoder.onnx")
    with torch.no_grad():
        model.blocks[-1].attn.value.bias.add_(1e-2)
    prompts = [tok.encode("hello").ids, tok.encode("a longer prompt here").ids]
    with pytest.raises(parity.ParityError, match="logits"):
        parity.decoder_parity(model, tmp_path / "decoder.onnx", prompts)
