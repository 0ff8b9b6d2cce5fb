"""`python -m export convert` on SPLADE folders (tests/fixtures/sparse.py): SparseEncoder folders and
plain masked LMs marked sparse.

What the manifest records (kind, vocabulary width, pooling, prompts, the reference figures), the
kind each folder converts to by default, SpladePooling's other settings (sum, log1p_relu) against
SparseEncoder itself, and what is refused, naming the file, the field and the value, before any
file is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SparseEncoder

from export.convert import ConversionError, Options, convert, load
from tests.fixtures.sparse import PROMPTS

TEXTS = ["The cat sat on the mat.", "Once upon a time, there was a little girl who loved books.", "short"]


def copy(source: Path, dst: Path) -> Path:
    shutil.copytree(source, dst)
    return dst


def edit(folder: Path, name: str, change) -> None:
    path = folder / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def test_manifest_records_the_sparse_kind(sparse_folders):
    m = json.loads((sparse_folders / "models" / "splade" / "model.json").read_text())
    vocab = json.loads((sparse_folders / "hf" / "splade" / "config.json").read_text())["vocab_size"]
    assert m["kind"] == "sparse-embedding" and m["embedding_dim"] == vocab
    assert m["extra"]["splade"] == {"pooling": "max", "activation": "relu"}
    assert m["extra"]["prompts"] == PROMPTS
    reference = m["extra"]["converted_from"]["reference"]["sparse-embedding"]
    assert reference["same_nonzero"] and reference["values_max_abs_diff"] <= 1e-4
    assert {g["role"] for g in m["graphs"]} == {"encoder", "attention"}
    assert m["graphs"][0]["outputs"][0]["name"] == "sparse_embedding"


def test_a_plain_masked_lm_converts_to_sparse_when_told(sparse_folders):
    raw = sparse_folders / "hf" / "splade-raw"
    assert load(raw).kind == "fill-mask"
    converted = load(raw, Options(kind="sparse-embedding"))
    assert converted.kind == "sparse-embedding" and converted.source["splade_pooling"] == "max"
    assert not converted.source["sentence_transformers"]


def test_sum_pooling_and_log1p_relu_equal_sparse_encoder(sparse_folders, tmp_path):
    folder = copy(sparse_folders / "hf" / "splade", tmp_path / "sum")
    edit(
        folder,
        "1_SpladePooling/config.json",
        lambda c: {**c, "pooling_strategy": "sum", "activation_function": "log1p_relu"},
    )
    converted = load(folder)
    assert converted.source["splade_pooling"] == "sum" and converted.source["splade_activation"] == "log1p_relu"
    want = SparseEncoder(str(folder), local_files_only=True).encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    tok = converted.tokenizer
    tok.enable_padding(pad_id=converted.special_tokens["pad"])
    batch = tok.encode_batch(TEXTS)
    ids = torch.tensor([e.ids for e in batch])
    mask = torch.tensor([e.attention_mask for e in batch])
    with torch.no_grad():
        got = converted.model(ids, mask).numpy()
    assert ((got > 0) == (want > 0)).all()
    np.testing.assert_allclose(got, want, atol=1e-4)


MODULE = "sentence_transformers.sparse_encoder.modules.sparse_auto_encoder.SparseAutoEncoder"
REFUSALS = [
    ("1_SpladePooling/config.json", lambda c: {**c, "pooling_strategy": "mean"}, "pooling_strategy = 'mean'"),
    ("1_SpladePooling/config.json", lambda c: {**c, "activation_function": "gelu"}, "activation_function"),
    ("modules.json", lambda m: [*m, {"idx": 2, "name": "2", "path": "2_SAE", "type": MODULE}], "SparseAutoEncoder"),
    ("sentence_bert_config.json", lambda c: {**c, "transformer_task": "feature-extraction"}, "transformer_task"),
]


@pytest.mark.parametrize("file, change, field", REFUSALS)
def test_unsupported_pipelines_are_refused_naming_file_and_field(file, change, field, sparse_folders, tmp_path):
    folder = copy(sparse_folders / "hf" / "splade", tmp_path / "bad")
    edit(folder, file, change)
    with pytest.raises(ConversionError, match=field) as refused:
        convert(folder, tmp_path / "out" / "bad", name="bad")
    assert file in str(refused.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_distilbert_splade_folder_converts_and_its_graph_equals_sparse_encoder(tmp_path):
    """DistilBertForMaskedLM (naver's SPLADE distil shape): converted, then the model directory's graph
    run by onnxruntime on a padded batch gives SparseEncoder.encode's vectors."""
    import onnxruntime as ort
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer
    from tokenizers import Tokenizer
    from transformers import DistilBertConfig, DistilBertForMaskedLM, DistilBertTokenizerFast

    from tests.fixtures.classifiers import _widen, _wordpiece_vocab

    raw = tmp_path / "raw"
    _wordpiece_vocab(raw)
    vocab = len((raw / "vocab.txt").read_text(encoding="utf-8").splitlines())
    config = DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    _widen(DistilBertForMaskedLM(config)).save_pretrained(raw)
    DistilBertTokenizerFast(str(raw / "vocab.txt")).save_pretrained(raw)
    folder = tmp_path / "splade-distil"
    SparseEncoder(modules=[Transformer(str(raw), transformer_task="fill-mask"), SpladePooling("max")]).save(str(folder))
    model_dir = convert(folder, tmp_path / "models" / "distil", name="distil")
    m = model_dir.manifest
    assert m.kind == "sparse-embedding" and m.extra["converted_from"]["architecture"] == "DistilBertForMaskedLM"
    tok = Tokenizer.from_file(str(model_dir.file(m.tokenizer["file"])))
    tok.enable_padding(pad_id=m.special_tokens["pad"])
    batch = tok.encode_batch(TEXTS)
    session = ort.InferenceSession(str(model_dir.file(m.graph("encoder", "fp32").file)))
    ids, mask = np.array([e.ids for e in batch]), np.array([e.attention_mask for e in batch])
    feeds = {"input_ids": ids, "attention_mask": mask}
    got = session.run(["sparse_embedding"], feeds)[0]
    want = SparseEncoder(str(folder), local_files_only=True).encode(TEXTS, convert_to_sparse_tensor=False).numpy()
    assert ((got > 0) == (want > 0)).all()
    np.testing.assert_allclose(got, want, atol=1e-4)
