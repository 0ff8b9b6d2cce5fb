"""`python -m export convert` on ModernBERT folders (modernbert_checkpoints.py), served by a real server.

Embed equals `SentenceTransformer.encode` on the same folder (with and without its instruction
prompts; mean and CLS pooling), FillMask's top tokens equal transformers' fill-mask pipeline,
Classify and Rerank scores equal `AutoModelForSequenceClassification`'s: through the packed graph
(the default) and the padded one (`embed_pack_row_tokens=0`). The texts are longer than the local
attention window, and a converted model given another window fails the check against transformers.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer, pipeline

from export.convert import ConversionError, Options, convert, load, reference
from export.convert.folder import HFFolder
from export.gate import parity
from export.models.classifier import HeadConfig
from export.models.modernbert import ModernBertClassifier, ModernBertConfig
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.export.convert.modernbert_checkpoints import PROMPTS, WINDOW, build

TEXTS = [
    "The cat sat on the mat while the dog slept by the door.",
    "Once upon a time, there was a little girl who loved books about dragons.",
    "Überraschung! Ça coûte 12,50 € — naïve café, Straße.",
    "A man is playing a guitar on the street while people walk by.",
]
EXECUTIONS = {"packed": {}, "padded": {"embed_pack_row_tokens": 0}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def models(folders, tmp_path_factory) -> Callable[..., Path]:
    """models(*names) -> a models folder holding those converted models (each converted once, when
    first asked for, so a test's setup pays only for its own)."""
    converted = tmp_path_factory.mktemp("converted")

    def root(*names: str) -> Path:
        out = tmp_path_factory.mktemp("models")
        for name in names:
            if not (converted / name).is_dir():
                convert(folders[name], converted / name, name=name)
            (out / name).symlink_to(converted / name, target_is_directory=True)
        return out

    return root


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)


async def serving(server, name: str) -> str:
    return (await server.models.GetModel(pb.GetModelRequest(name=name))).manifest["serving.execution"]


def test_the_texts_are_longer_than_the_local_window(folders):
    tok = AutoTokenizer.from_pretrained(folders["mb-embed"])
    assert min(len(tok(t)["input_ids"]) for t in TEXTS) > 2 * WINDOW


@pytest.mark.parametrize("name", ["mb-embed", "mb-mlm", "mb-cls3"])
def test_a_wrong_local_window_fails_the_check_against_transformers(name, folders):
    converted = load(folders[name])  # passed with the folder's window
    converted.model.config.local_window = 4 * WINDOW
    with pytest.raises(parity.ParityError):
        reference.check(HFFolder(folders[name]), converted)


def test_manifest_records_the_architecture(models):
    root = models("mb-embed", "mb-cls3")
    manifest = json.loads((root / "mb-embed" / "model.json").read_text())
    assert manifest["architecture"]["type"] == "modernbert-encoder"
    layers = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert manifest["architecture"]["layer_types"] == layers and manifest["architecture"]["local_window"] == WINDOW
    assert manifest["pooling"] == "mean" and manifest["extra"]["prompts"] == PROMPTS
    assert {g["role"] for g in manifest["graphs"]} == {"encoder", "packed", "attention"}
    assert manifest["extra"]["converted_from"]["reference"]["embedding"]["cos_min"] >= 0.99999
    classifier = json.loads((root / "mb-cls3" / "model.json").read_text())
    assert classifier["architecture"]["type"] == "modernbert-classifier"
    assert classifier["extra"]["labels"] == ["negative", "neutral", "positive"]
    assert classifier["extra"]["activation"] == "softmax"
    assert [i["name"] for i in classifier["graphs"][0]["inputs"]] == ["input_ids", "attention_mask"]


@pytest.mark.parametrize("execution", list(EXECUTIONS))
@pytest.mark.parametrize("name", ["mb-embed", "mb-gte"])
async def test_embed_equals_sentence_transformers(name, execution, folders, models, start_server):
    st = SentenceTransformer(str(folders[name]), device="cpu", local_files_only=True)
    server = await start_server(models(name), **EXECUTIONS[execution])
    assert await serving(server, name) == execution
    prompts = [None, *PROMPTS] if name == "mb-embed" else [None]
    for prompt_name in prompts:
        fields = {"prompt_name": prompt_name} if prompt_name else {}
        reply = await server.embedding.Embed(pb.EmbedRequest(model=name, inputs=TEXTS, **fields))
        got = np.array([list(e.values) for e in reply.embeddings], dtype=np.float32)
        want = st.encode(TEXTS, prompt_name=prompt_name)
        assert cosines(got, want).min() >= 0.99999, prompt_name


async def test_fill_mask_top_tokens_equal_transformers(folders, models, start_server):
    folder = folders["mb-mlm"]
    tok = AutoTokenizer.from_pretrained(folder)
    fill = pipeline("fill-mask", model=AutoModelForMaskedLM.from_pretrained(folder), tokenizer=tok, top_k=5)
    texts = [
        f"The cat sat on the mat while the dog slept by the {tok.mask_token}.",
        f"Once upon a {tok.mask_token}, there was a little girl who loved books about dragons.",
    ]
    for execution, settings in EXECUTIONS.items():
        server = await start_server(models("mb-mlm"), **settings)
        assert await serving(server, "mb-mlm") == execution
        reply = await pb_grpc.FillMaskServiceStub(server.channel).FillMask(
            pb.FillMaskRequest(model="mb-mlm", inputs=texts, top_k=5)
        )
        for text, result in zip(texts, reply.results, strict=True):
            want = fill(text)
            got = result.masks[0].candidates
            assert [p.token_id for p in got] == [w["token"] for w in want]
            assert np.allclose([p.score for p in got], [w["score"] for w in want], atol=1e-4)


def transformers_logits(folder: Path, firsts: list[str], seconds: list[str] | None = None) -> np.ndarray:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    batch = tok(firsts, seconds, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits.numpy()


@pytest.mark.parametrize("execution", list(EXECUTIONS))
async def test_classify_scores_equal_transformers(execution, folders, models, start_server):
    """Three labels, mean pooling: single texts and pairs, softmax over the labels."""
    firsts, seconds = TEXTS, TEXTS[1:] + TEXTS[:1]
    server = await start_server(models("mb-cls3"), **EXECUTIONS[execution])
    assert await serving(server, "mb-cls3") == execution
    stub = pb_grpc.ClassificationServiceStub(server.channel)
    inputs = [pb.ClassifyInput(text=t) for t in firsts] + [
        pb.ClassifyInput(text=a, text_pair=b) for a, b in zip(firsts, seconds)
    ]
    reply = await stub.Classify(pb.ClassifyRequest(model="mb-cls3", inputs=inputs))
    logits = np.concatenate(
        [transformers_logits(folders["mb-cls3"], firsts), transformers_logits(folders["mb-cls3"], firsts, seconds)]
    )
    want = torch.softmax(torch.from_numpy(logits), -1).numpy()
    got = np.zeros_like(want)
    for row, result in enumerate(reply.results):
        for s in result.labels:
            got[row, s.label_id] = s.score
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("execution", list(EXECUTIONS))
async def test_rerank_scores_equal_transformers(execution, folders, models, start_server):
    """One label, CLS pooling: sigmoid of the pair's logit, best first."""
    query = "Who loved books about dragons?"
    server = await start_server(models("mb-ce"), **EXECUTIONS[execution])
    assert await serving(server, "mb-ce") == execution
    stub = pb_grpc.ClassificationServiceStub(server.channel)
    reply = await stub.Rerank(pb.RerankRequest(model="mb-ce", query=query, documents=TEXTS))
    logits = transformers_logits(folders["mb-ce"], [query] * len(TEXTS), TEXTS)[:, 0]
    want = 1 / (1 + np.exp(-logits))
    assert [r.index for r in reply.results] == list(np.argsort(-want))
    np.testing.assert_allclose([r.score for r in reply.results], np.sort(want)[::-1], atol=1e-4)


def older_config(folder: Path) -> None:
    """config.json as the Hub's ModernBERT folders write it: no layer_types or rope_parameters."""
    config = json.loads((folder / "config.json").read_text())
    thetas = {k: v["rope_theta"] for k, v in config.pop("rope_parameters").items()}
    del config["layer_types"]
    config.update(global_rope_theta=thetas["full_attention"], local_rope_theta=thetas["sliding_attention"])
    (folder / "config.json").write_text(json.dumps(config))


def test_the_hubs_older_config_form_converts_the_same(folders, tmp_path):
    folder = tmp_path / "older"
    shutil.copytree(folders["mb-mlm"], folder)
    older_config(folder)
    got, want = load(folder), load(folders["mb-mlm"])  # each checked against transformers
    assert got.model.config == want.model.config


def test_a_masked_lm_folder_converts_as_an_embedder(folders):
    """--kind embedding: the encoder alone, its head left out, checked against transformers' AutoModel."""
    converted = load(folders["mb-mlm"], Options(kind="embedding", pooling="cls"))
    assert converted.kind == "embedding" and converted.source["reference"]["embedding"]["cos_min"] >= 0.99999
    assert not any(k.startswith("head.") for k in converted.model.state_dict())


REFUSALS = [
    (lambda c: {**c, "hidden_activation": "mish"}, "hidden_activation"),
    (lambda c: {**c, "classifier_pooling": "max"}, "classifier_pooling"),
    (
        lambda c: {**c, "rope_parameters": {**c["rope_parameters"], "full_attention": {"rope_type": "yarn"}}},
        "rope_type",
    ),
    (lambda c: {**c, "layer_types": ["full_attention"]}, "layer_types"),
]


@pytest.mark.parametrize("change, field", REFUSALS)
def test_unsupported_options_are_refused_naming_the_field(change, field, folders, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(folders["mb-cls3"], folder)
    config = folder / "config.json"
    config.write_text(json.dumps(change(json.loads(config.read_text()))))
    with pytest.raises(ConversionError, match=field) as refused:
        convert(folder, tmp_path / "out" / "bad", name="bad")
    assert "config.json" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_the_modules_build_their_tensors_on_the_inputs_device():
    """Masks, rotary angles and packed pooling follow the input's device (meta here), as the other
    models' do (tests/export/test_export_device.py), so they run on CUDA as on the CPU."""
    meta = torch.device("meta")
    layers = ["full_attention", "sliding_attention"]
    cfg = ModernBertConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, d_ff=24, layer_types=layers)
    cfg.local_window, cfg.max_length, cfg.pad_token_id, cfg.classifier_pooling = 4, 16, 0, "mean"
    with meta:
        model = ModernBertClassifier(cfg, HeadConfig(labels=["a", "b"], token_types=False))
    ids = torch.zeros(2, 9, dtype=torch.long, device=meta)
    assert model(ids, torch.ones_like(ids)).shape == (2, 2)
    tokens = model.encoder.packed_hidden(ids, torch.zeros_like(ids), torch.ones_like(ids))
    logits = model.classify_packed(tokens, torch.ones_like(ids), torch.tensor([0, 9], device=meta))
    assert (logits.device, logits.shape) == (meta, (2, 2))
