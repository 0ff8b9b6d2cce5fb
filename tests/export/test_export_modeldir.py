"""Model directories: tampered ones are refused naming the file; builds are atomic and skip when current."""

from __future__ import annotations

import json

import pytest

from export.gate import parity
from export.modeldir import is_current, source_hash
from export.tiny import build_tiny
from service.manifest import ModelDirError, load_model_dir
from tests.fixtures.models import copy_model_dir


@pytest.fixture
def embed_copy(tiny_models_root, tmp_path):
    return copy_model_dir(tiny_models_root / "tiny-embed", tmp_path)


def _edit_manifest(d, edit) -> None:
    m = json.loads((d / "model.json").read_text())
    edit(m)
    (d / "model.json").write_text(json.dumps(m))


def test_edited_graph_is_refused(embed_copy):
    graph = embed_copy / "encoder.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the weights
    graph.write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match=r"encoder\.onnx: sha256 mismatch"):
        load_model_dir(embed_copy)


def test_wrong_hash_in_manifest_is_refused(embed_copy):
    def zero_optimized(m):
        next(g for g in m["graphs"] if g["file"] == "encoder.optimized.onnx").update(sha256="0" * 64)

    _edit_manifest(embed_copy, zero_optimized)
    with pytest.raises(ModelDirError, match=r"encoder\.optimized\.onnx: sha256 mismatch"):
        load_model_dir(embed_copy)


def test_missing_tokenizer_is_refused(embed_copy):
    (embed_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelDirError, match=r"tokenizer\.json: missing"):
        load_model_dir(embed_copy)


def test_missing_graph_and_bad_manifest_are_refused(embed_copy):
    (embed_copy / "encoder.int8.onnx").unlink()
    with pytest.raises(ModelDirError, match=r"encoder\.int8\.onnx: missing"):
        load_model_dir(embed_copy)
    (embed_copy / "model.json").write_text("{not json")
    with pytest.raises(ModelDirError, match=r"model\.json: malformed manifest"):
        load_model_dir(embed_copy)


def test_graph_path_outside_the_directory_is_refused(embed_copy):
    _edit_manifest(embed_copy, lambda m: m["graphs"][0].update(file="../encoder.onnx"))
    with pytest.raises(ModelDirError, match="plain file name"):
        load_model_dir(embed_copy)


@pytest.mark.parametrize("ends", ["2", [2, "9"], [2, -1], [True]])
def test_malformed_eos_token_ids_are_refused(embed_copy, ends):
    _edit_manifest(embed_copy, lambda m: m["extra"].update(eos_token_ids=ends))
    with pytest.raises(ModelDirError, match=r"extra\.eos_token_ids must be a list of token ids"):
        load_model_dir(embed_copy)


def test_manifest_hashes_match_files(tiny_models_root):
    for d in tiny_models_root.iterdir():
        md = load_model_dir(d)  # verifies every sha256
        assert md.manifest.tokenizer["file"] == "tokenizer.json"
        assert {g.file for g in md.manifest.graphs} <= {p.name for p in d.iterdir()}


def test_failed_gate_leaves_nothing_behind(tmp_path, monkeypatch):
    out = tmp_path / "tiny-embed"

    def failing_gate(*args, **kwargs):
        raise parity.ParityError("parity gate: forced miss for this test")

    monkeypatch.setattr(parity, "encoder_parity", failing_gate)
    with pytest.raises(parity.ParityError):
        build_tiny("embedding", out)
    assert list(tmp_path.iterdir()) == []  # no directory, no staging leftovers


def test_is_current_tracks_the_source_hash(tmp_path):
    digest = source_hash(salt="test")
    out = tmp_path / "tiny-embed"
    assert not is_current(out, digest)
    from export.build import build_model_dir
    from export.tiny import byte_tokenizer, special_tokens, tiny_model

    tok = byte_tokenizer("embedding")
    build_model_dir(
        "embedding",
        tiny_model("embedding", tok.get_vocab_size()),
        tok,
        out,
        name="tiny-embed",
        special_tokens=special_tokens("embedding", tok),
        extra={"source_sha256": digest},
    )
    assert is_current(out, digest)
    assert not is_current(out, source_hash(salt="other"))
    (out / "tokenizer.json").write_text("{}")
    assert not is_current(out, digest)  # modified file: rebuild
