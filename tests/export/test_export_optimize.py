"""The optimizer on a decoder graph with its weights held aside (export/onnx/graphs.py
`make_optimized`, store.hold_weights): the same graph as the optimizer on the whole model, and a
fusion that reads a held weight falls back to the whole model rather than writing anything else."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnxruntime.transformers.optimizer import optimize_model

from export.onnx import graphs, store
from export.tiny import NAMES
from service.manifest import load_model_dir


def _whole(src, model_type, heads, d_model) -> onnx.ModelProto:
    """What the optimizer writes from the whole graph (make_optimized before weights were held)."""
    return optimize_model(str(src), model_type=model_type, num_heads=heads, hidden_size=d_model, opt_level=0).model


def _decoder(root, kind):
    md = load_model_dir(root / NAMES[kind])
    a = md.manifest.architecture
    heads, d_model = a["n_heads"], a["d_model"]
    return md.path / "decoder.onnx", heads, d_model


def test_hold_and_restore_give_back_the_same_model():
    rng = np.random.default_rng(0)
    big, small = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"]), onnx.helper.make_node("Add", ["y", "b"], ["z"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 64])],
        [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["n", 32])],
        [numpy_helper.from_array(big, "w"), numpy_helper.from_array(small, "b")],
    )
    model = onnx.helper.make_model(graph)
    before = model.SerializeToString()
    held = store.hold_weights(model, big.nbytes)
    assert list(held) == ["w"] and model.ByteSize() < big.nbytes  # the matrix is out, the bias in
    with pytest.raises(onnx.checker.ValidationError, match=store.HELD):
        numpy_helper.to_array(model.graph.initializer[0])  # read by mistake: loud
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[1]), small)
    kept = dict(held)
    assert store.restore_weights(model, held) == []
    assert held == {} and model.SerializeToString() == before
    # A held weight copied under a new name has no bytes to get back: said, not guessed.
    store.hold_weights(model, big.nbytes)
    model.graph.initializer[0].name = "w_copy"
    assert store.restore_weights(model, kept) == ["w_copy"]


@pytest.mark.parametrize("kind", ["generation", "translation"])
def test_a_decoder_optimized_with_weights_held_is_the_same_graph(tiny_models_root, tmp_path, monkeypatch, caplog, kind):
    src, heads, d_model = _decoder(tiny_models_root, kind)
    monkeypatch.setattr(graphs, "HOLD_MIN_BYTES", 4096)  # the tiny graphs' matrices (4-33 KB), not their biases
    held: list[str] = []
    hold = store.hold_weights

    def spy(model, min_bytes):
        taken = hold(model, min_bytes)
        held.extend(taken)
        return taken

    monkeypatch.setattr(store, "hold_weights", spy)
    with caplog.at_level(logging.INFO, logger=graphs.__name__):
        counts = graphs.make_optimized(src, tmp_path / "held.onnx", "gpt2", heads, d_model)
    assert "(weights held aside)" in caplog.text and len(held) >= 8
    assert counts.get("SkipLayerNormalization", 0) > 0
    whole = _whole(src, "gpt2", heads, d_model)
    assert onnx.load(str(tmp_path / "held.onnx")).SerializeToString() == whole.SerializeToString()


def test_a_fusion_that_reads_a_held_weight_gets_the_whole_graph(tiny_models_root, tmp_path, monkeypatch, caplog):
    src, heads, d_model = _decoder(tiny_models_root, "generation")
    # Biases held too: onnxruntime's QOrderedMatMul fusion reads them, so the held run fails.
    monkeypatch.setattr(graphs, "HOLD_MIN_BYTES", 256)
    with caplog.at_level(logging.INFO, logger=graphs.__name__):
        graphs.make_optimized(src, tmp_path / "whole.onnx", "gpt2", heads, d_model)
    assert "a fusion reads a weight matrix" in caplog.text and "(whole graph)" in caplog.text
    whole = _whole(src, "gpt2", heads, d_model)
    assert onnx.load(str(tmp_path / "whole.onnx")).SerializeToString() == whole.SerializeToString()
