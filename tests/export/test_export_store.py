"""Graphs past protobuf's 2 GiB: stored with their tensors in one data file beside the graph
(export/onnx/store.py), named and hashed in the manifest, and served the same as one-file graphs.

The limit is lowered (TS_ONNX_INLINE_BYTES) so tiny models take the path a 1B model takes.
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.onnx import store
from export.tiny import build_tiny
from service.manifest import ModelDirError, load_model_dir
from tests.fixtures.models import copy_model_dir
from tests.fixtures.server import generate_stream


def _matmul_model(seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    w = np.random.default_rng(seed).standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def test_a_graph_past_the_limit_keeps_its_tensors_beside_it(tmp_path, monkeypatch):
    path = tmp_path / "g.onnx"
    model, w = _matmul_model()
    assert store.tensor_bytes(model) == w.nbytes
    monkeypatch.setenv("TS_ONNX_INLINE_BYTES", str(w.nbytes - 1))
    assert store.save(model, path) == tmp_path / "g.onnx.data"
    assert store.data_file(path).stat().st_size == w.nbytes
    assert path.stat().st_size < 1000  # the graph alone
    assert store.files(path) == [path, tmp_path / "g.onnx.data"]
    loaded = store.load(path)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), w)
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    (y,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
    # Saved again under the limit: one file, the stale data file gone.
    monkeypatch.setenv("TS_ONNX_INLINE_BYTES", str(w.nbytes))
    assert store.save(loaded, path) is None
    assert store.files(path) == [path] and not store.data_file(path).exists()
    (again,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(again, y)


@pytest.fixture(scope="module")
def outside_root(tmp_path_factory):
    """tiny-gpt and tiny-embed exported with every graph's tensors in a data file."""
    root = tmp_path_factory.mktemp("outside")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TS_ONNX_INLINE_BYTES", "0")
        build_tiny("generation", root / "tiny-gpt", ("optimized", "int8"))
        build_tiny("embedding", root / "tiny-embed", ("optimized", "int8"))
    return root


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-embed"])
def test_tiny_models_export_with_data_files_through_the_same_gate(outside_root, tiny_models_root, name):
    md = load_model_dir(outside_root / name)
    inline = load_model_dir(tiny_models_root / name).manifest
    for g in md.manifest.graphs:
        assert g.data and g.data["file"] == g.file + ".data", g.file
        graph = onnx.load(str(md.path / g.file), load_external_data=False).graph
        outside = [t for t in graph.initializer if t.data_location == TensorProto.EXTERNAL]
        assert outside and all(len(t.raw_data) < store.MIN_EXTERNAL_TENSOR for t in graph.initializer)
    # Same weights (seeded), so the gate measured the same graphs: the same figures.
    for g in inline.graphs:
        if g.variant in ("fp32", "int8"):
            got = md.manifest.graph(g.role, g.variant).parity
            for key in ("quality", "batch_max_abs_diff", "greedy_identical", "min_cosine", "prefill_max_abs_diff"):
                if key in g.parity:
                    assert got[key] == g.parity[key], (g.file, key)
    assert sorted(p.name for p in md.path.iterdir() if p.name.startswith(".")) == []  # no scratch left


def test_a_changed_data_file_is_refused(outside_root, tmp_path):
    import shutil

    dst = tmp_path / "tiny-gpt"
    shutil.copytree(outside_root / "tiny-gpt", dst)
    data = dst / load_model_dir(dst).manifest.graph("decoder", "int8").data["file"]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(ModelDirError, match=r"decoder\.int8\.onnx\.data: sha256 mismatch"):
        load_model_dir(dst)
    data.unlink()
    with pytest.raises(ModelDirError, match=r"decoder\.int8\.onnx\.data: missing"):
        load_model_dir(dst, verify_hashes=False)


async def test_models_with_data_files_serve_the_same_answers(outside_root, tiny_models_root, start_server, tmp_path):
    from client import embed_request

    inline = tmp_path / "inline"
    for name in ("tiny-gpt", "tiny-embed"):
        copy_model_dir(tiny_models_root / name, inline)
    answers = []
    for root in (inline, outside_root):
        srv = await start_server(root, variant="int8")
        chunks = await generate_stream(srv, "Once upon a time", max_new_tokens=24)
        embedded = await srv.embedding.Embed(embed_request(["a data file", "beside the graph"], model="tiny-embed"))
        answers.append(("".join(c.text for c in chunks), [list(e.values) for e in embedded.embeddings]))
        await asyncio.sleep(0)
    assert answers[0][0] and answers[0] == answers[1]


async def test_a_model_past_protobufs_limit_builds_what_it_can(tmp_path, monkeypatch, start_server):
    """What a 1B decoder gets, on tiny-gpt with the limit at 0: no optimized graph (fusing does not
    pay at that size), fp16 typed from the files, int8 from fp32, decode
    timings one variant at a time, and no attention graph, which the inspection door says
    (FAILED_PRECONDITION, not INTERNAL)."""
    import grpc

    from service.proto import inference_pb2 as pb
    from service.proto import inference_pb2_grpc as pb_grpc

    monkeypatch.setenv("TS_ONNX_INLINE_BYTES", "0")
    monkeypatch.setattr(store, "PROTOBUF_LIMIT", 0)
    md = build_tiny("generation", tmp_path / "tiny-gpt", ("optimized", "fp16", "int8"))
    m = md.manifest
    assert sorted(g.variant for g in m.graphs) == ["fp16", "fp32", "int8"]
    assert m.graph("decoder", "fp16").parity["greedy_identical"]  # typed by onnx's shape inference on the files
    assert m.parity["attention_ok"] is False and "past 2 GiB" in m.parity["attention_skipped"]
    assert m.parity["speed"]["alternated"] is False and set(m.parity["speed"]["step_us"]) == {"fp32", "int8"}
    assert m.graph("decoder", "int8").parity["quality"]["tokens"] > 0
    srv = await start_server(tmp_path)
    chunks = await generate_stream(srv, "Once upon a time", max_new_tokens=8)
    assert sum(len(c.token_ids) for c in chunks) > 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pb_grpc.InspectionServiceStub(srv.channel).Attention(
            pb.AttentionRequest(text="a big model", model="tiny-gpt")
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "for a model this large" in err.value.details()
