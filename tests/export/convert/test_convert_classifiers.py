"""`python -m export convert` on sequence-classification and CrossEncoder folders (tests/fixtures/classifiers.py).

What the manifest records (labels, activation, the gate's figures: pair ids and token type ids
equal to transformers' for a BERT folder whose tokenizer is only a vocab.txt), and what is refused,
naming the file, the field and the value, before any file is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from export.convert import ConversionError, convert, load
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc


def test_manifest_records_head_labels_and_activation(classifier_folders):
    models = classifier_folders / "models"
    bert = json.loads((models / "bert-ce" / "model.json").read_text())
    assert bert["kind"] == "classification" and bert["extra"]["labels"] == ["LABEL_0"]
    assert bert["extra"]["activation"] == "sigmoid"
    assert [i["name"] for i in bert["graphs"][0]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    reference = bert["extra"]["converted_from"]["reference"]
    assert reference["tokenizer"]["same_type_ids"] and reference["tokenizer"]["pairs"]
    assert reference["classification"]["logits_max_abs_diff"] <= 1e-3
    assert {g["variant"] for g in bert["graphs"]} == {"fp32", "optimized"}
    xlmr = json.loads((models / "xlmr-ce" / "model.json").read_text())
    assert [i["name"] for i in xlmr["graphs"][0]["inputs"]] == ["input_ids", "attention_mask"]
    assert xlmr["architecture"]["position_offset"] == 2
    three = json.loads((models / "bert-cls3" / "model.json").read_text())
    assert three["extra"]["labels"] == ["negative", "neutral", "positive"]
    assert three["extra"]["activation"] == "softmax"
    assert not three["extra"]["converted_from"]["cross_encoder"]


def copy(source: Path, dst: Path) -> Path:
    shutil.copytree(source, dst)
    return dst


def edit(folder: Path, name: str, change) -> None:
    path = folder / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


REFUSALS = [
    (
        "bert-ce",
        "config_sentence_transformers.json",
        lambda c: {**c, "activation_fn": "torch.nn.Tanh"},
        "activation_fn",
    ),
    ("bert-cls3", "config.json", lambda c: {**c, "id2label": {"0": "a", "2": "c"}}, "id2label"),
    ("bert-cls3", "config.json", lambda c: {**c, "problem_type": "ranking"}, "problem_type"),
    ("bert-cls3", "config.json", lambda c: {**c, "hidden_act": "mish"}, "hidden_act"),
    (
        "bert-ce",
        "modules.json",
        lambda m: [*m, {"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.models.Dense"}],
        "Dense",
    ),
    (
        "bert-ce",
        "sentence_bert_config.json",
        lambda c: {**c, "processing_kwargs": {"text": {"truncation": "only_first"}}},
        "truncation = 'only_first'",
    ),
    (
        "xlmr-ce",
        "tokenizer.json",
        lambda t: {**t, "truncation": {"max_length": 8, "strategy": "OnlyFirst", "stride": 0, "direction": "Right"}},
        "truncation = 'only_first'",
    ),
]


@pytest.mark.parametrize("name, file, change, field", REFUSALS)
def test_unsupported_options_are_refused_naming_file_and_field(name, file, change, field, classifier_folders, tmp_path):
    folder = copy(classifier_folders / "hf" / name, tmp_path / "bad")
    edit(folder, file, change)
    with pytest.raises(ConversionError, match=field) as refused:
        convert(folder, tmp_path / "out" / "bad", name="bad")
    assert file in str(refused.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_activation_follows_the_folder(classifier_folders, tmp_path):
    """An Identity CrossEncoder activation serves logits; multi-label classifiers use sigmoid per label."""
    folder = copy(classifier_folders / "hf" / "bert-ce", tmp_path / "identity")
    edit(
        folder,
        "config_sentence_transformers.json",
        lambda c: {**c, "activation_fn": "torch.nn.modules.linear.Identity"},
    )
    assert load(folder).source["activation"] == "none"
    folder = copy(classifier_folders / "hf" / "bert-cls3", tmp_path / "multi")
    edit(folder, "config.json", lambda c: {**c, "problem_type": "multi_label_classification"})
    assert load(folder).source["activation"] == "sigmoid"


async def test_reduced_precision_variants_are_judged_and_served(classifier_folders, tmp_path, start_server):
    """fp16 and int8 graphs (padded and packed) carry their score figures and a quality verdict;
    served (int8: packed in aligned rows), their scores stay near transformers'."""
    out = tmp_path / "bert-cls3"
    convert(classifier_folders / "hf" / "bert-cls3", out, name="bert-cls3", variants=("fp16", "int8"))
    manifest = json.loads((out / "model.json").read_text())
    reduced = [g for g in manifest["graphs"] if g["variant"] in ("fp16", "int8")]
    assert {(g["role"], g["variant"]) for g in reduced} == {
        (r, v) for r in ("encoder", "packed") for v in ("fp16", "int8")
    }
    for graph in reduced:
        figures = graph["parity"]
        assert isinstance(figures["quality_ok"], bool) and figures["packed"]["score_max_abs_diff"] >= 0
        assert figures["quality_ok"] == (
            figures["score_max_abs_diff"] <= 0.01
            and figures["batch_max_abs_diff"] <= 1e-4
            and figures["packed"]["score_max_abs_diff"] <= 0.01
            and figures["packed"]["batch_max_abs_diff"] <= 1e-4
        )
    texts = ["The cat sat on the mat.", "Once upon a time, there was a little girl who loved books."]
    folder = str(classifier_folders / "hf" / "bert-cls3")
    tok, hf = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        want = torch.softmax(hf(**tok(texts, padding=True, return_tensors="pt")).logits, -1).numpy()
    for variant in ("fp16", "int8"):
        srv = await start_server(tmp_path, variant=variant)
        info = await srv.models.GetModel(pb.GetModelRequest(name="bert-cls3"))
        assert info.variant == variant and info.manifest["serving.execution"] == "packed"
        stub = pb_grpc.ClassificationServiceStub(srv.channel)
        reply = await stub.Classify(pb.ClassifyRequest(inputs=[pb.ClassifyInput(text=t) for t in texts]))
        got = np.zeros_like(want)
        for row, result in enumerate(reply.results):
            for s in result.labels:
                got[row, s.label_id] = s.score
        np.testing.assert_allclose(got, want, atol=0.05)


def test_a_variant_below_the_gate_is_kept_and_named(classifier_folders, tmp_path, monkeypatch, caplog):
    """A classifier's int8 graph that misses the score limits still converts (kept for whoever asks
    by name), with quality_ok false and a warning carrying the gate's figures."""
    from export.onnx import classifier as cls

    monkeypatch.setitem(cls.SCORE_LIMITS, "score_max_abs_diff", 0.0)  # no int8 score is exact
    out = tmp_path / "bert-ce"
    with caplog.at_level("WARNING", logger="export.build"):
        convert(classifier_folders / "hf" / "bert-ce", out, name="bert-ce", variants=("int8",))
    graph = next(g for g in json.loads((out / "model.json").read_text())["graphs"] if g["variant"] == "int8")
    assert graph["parity"]["quality_ok"] is False and graph["parity"]["score_max_abs_diff"] > 0
    warned = [r.getMessage() for r in caplog.records if "below the quality gate" in r.getMessage()]
    assert len(warned) == 1 and "int8" in warned[0] and "score_max_abs_diff" in warned[0]


def test_pair_truncation_follows_the_folder(classifier_folders, tmp_path):
    """only_second from a CrossEncoder's processing_kwargs or the tokenizer.json's strategy; longest_first
    (CrossEncoder's default) otherwise; the reference check holds either way."""
    assert json.loads((classifier_folders / "models" / "bert-ce" / "model.json").read_text())["extra"][
        "truncation"
    ] == ("longest_first")
    folder = copy(classifier_folders / "hf" / "bert-ce", tmp_path / "kwargs")
    edit(
        folder,
        "sentence_bert_config.json",
        lambda c: {**c, "processing_kwargs": {"text": {"truncation": "only_second"}}},
    )
    converted = load(folder)
    assert converted.source["truncation"] == "only_second"
    assert converted.source["reference"]["tokenizer"]["refused_alike"] > 0  # first texts past the short limit
    folder = copy(classifier_folders / "hf" / "xlmr-ce", tmp_path / "tokenizer")
    edit(
        folder,
        "tokenizer.json",
        lambda t: {**t, "truncation": {"max_length": 8, "strategy": "OnlySecond", "stride": 0, "direction": "Right"}},
    )
    assert load(folder).source["truncation"] == "only_second"
