"""`python -m export convert` on BERT, RoBERTa and XLM-R folders: embeddings and fill-mask.

Each checkpoint is built here, offline: a transformers config, random weights (wider than the
usual init so outputs vary), `save_pretrained`, and a tokenizer trained in code on the
repository's held-out text. The converted model directory is served by a real server and compared
with transformers on the same folder: Embed against transformers' hidden states pooled as the
folder says (cosine >= 0.9999), FillMask against transformers' fill-mask pipeline (same top-k).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForMaskedLM,
    XLMRobertaConfig,
    XLMRobertaModel,
    pipeline,
)

from export.convert import ConversionError, Options, convert, load
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.paths import ROOT

TEXTS = [
    "The cat sat on the mat.",
    "Once upon a time, there was a little girl who loved books.",
    "Überraschung! Ça coûte 12,50 € — naïve café.",
    "short",
    "A man is playing a guitar on the street.",
]


def corpus() -> list[str]:
    lines = []
    for name, key in (("tinystories-gpt", "text"), ("tatoeba-en-fr", "source")):
        for line in (ROOT / "checkpoints" / name / "heldout.jsonl").read_text(encoding="utf-8").splitlines():
            lines.append(json.loads(line)[key])
    return lines


def trained_wordpiece() -> Tokenizer:
    """BERT's normaliser and pre-tokenizer, a 400-piece WordPiece vocabulary trained on the held-out text."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials))
    return tok


def wordpiece(folder: Path) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer ([CLS] ... [SEP]) trained on the held-out text."""
    tok = trained_wordpiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")]
    )
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(folder)
    return fast


def byte_bpe(folder: Path) -> PreTrainedTokenizerFast:
    """A RoBERTa-style byte-level BPE (<s> ... </s>, <pad> = 1) trained on the held-out text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[(t, tok.token_to_id(t)) for t in ("<s>", "</s>")]
    )
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
    )
    fast.save_pretrained(folder)
    return fast


def widen(model: torch.nn.Module, std: float = 0.2) -> torch.nn.Module:
    torch.manual_seed(0)
    for _name, p in model.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=std)
    return model


def sizes(vocab: int, **extra) -> dict:
    return dict(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **extra
    )


def sentence_transformers_folder(folder: Path, pooling: str, normalize: bool = True) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 32,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": pooling == "max",
            }
        )
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """bert-st (sentence-transformers, mean), roberta-mlm, xlmr (max pooling), bert-mlm."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    folder = root / "bert-st"
    tok = wordpiece(folder)
    widen(BertModel(BertConfig(**sizes(tok.vocab_size, max_position_embeddings=64)))).save_pretrained(folder)
    sentence_transformers_folder(folder, "mean")
    out["bert-st"] = folder
    folder = root / "bert-mlm"
    tok = wordpiece(folder)
    widen(BertForMaskedLM(BertConfig(**sizes(tok.vocab_size, max_position_embeddings=64)))).save_pretrained(folder)
    out["bert-mlm"] = folder
    folder = root / "roberta-mlm"
    tok = byte_bpe(folder)
    cfg = RobertaConfig(**sizes(tok.vocab_size, max_position_embeddings=66, pad_token_id=1, type_vocab_size=1))
    widen(RobertaForMaskedLM(cfg)).save_pretrained(folder)
    out["roberta-mlm"] = folder
    folder = root / "xlmr"
    tok = byte_bpe(folder)
    cfg = XLMRobertaConfig(**sizes(tok.vocab_size, max_position_embeddings=66, pad_token_id=1, type_vocab_size=1))
    widen(XLMRobertaModel(cfg)).save_pretrained(folder)
    sentence_transformers_folder(folder, "max", normalize=False)
    out["xlmr"] = folder
    return out


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("converted")
    for name, folder in checkpoints.items():
        convert(folder, root / name, name=name)
    return root


def reference_embeddings(folder: Path, texts: list[str], pooling: str) -> np.ndarray:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=40, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][:, :, None].float()
    if pooling == "mean":
        pooled = (hidden * mask).sum(1) / mask.sum(1)
    elif pooling == "max":
        pooled = hidden.masked_fill(mask == 0, -1e9).max(1).values
    else:
        pooled = hidden[:, 0]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.mark.parametrize("name, pooling", [("bert-st", "mean"), ("xlmr", "max"), ("roberta-mlm", "mean")])
async def test_embed_matches_transformers(name, pooling, checkpoints, converted, tmp_path, start_server):
    if name == "roberta-mlm":  # a masked-LM folder served as an embedding model (--kind embedding)
        convert(
            checkpoints[name],
            tmp_path / "roberta-embed",
            name="roberta-embed",
            options=Options(kind="embedding", max_input_tokens=40),
        )
        root, model = tmp_path, "roberta-embed"
    else:
        root, model = converted, name
    server = await start_server(root)
    reply = await server.embedding.Embed(pb.EmbedRequest(model=model, inputs=TEXTS))
    got = np.array([list(e.values) for e in reply.embeddings], dtype=np.float32)
    want = reference_embeddings(checkpoints[name], TEXTS, pooling)
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cos.min() >= 0.9999, cos


@pytest.mark.parametrize("name", ["bert-mlm", "roberta-mlm"])
async def test_fill_mask_matches_transformers_pipeline(name, checkpoints, converted, start_server):
    folder = checkpoints[name]
    tok = AutoTokenizer.from_pretrained(folder)
    fill = pipeline("fill-mask", model=AutoModelForMaskedLM.from_pretrained(folder), tokenizer=tok, top_k=5)
    texts = [f"The cat sat on the {tok.mask_token}.", f"Once upon a {tok.mask_token}, there was a girl."]
    server = await start_server(converted)
    reply = await pb_grpc.FillMaskServiceStub(server.channel).FillMask(
        pb.FillMaskRequest(model=name, inputs=texts, top_k=5)
    )
    for text, result in zip(texts, reply.results, strict=True):
        want = fill(text)
        got = result.masks[0].candidates
        assert [p.token_id for p in got] == [w["token"] for w in want]
        assert np.allclose([p.score for p in got], [w["score"] for w in want], atol=1e-4)


def test_manifest_records_the_source(converted):
    manifest = json.loads((converted / "xlmr" / "model.json").read_text())
    assert manifest["pooling"] == "max"
    assert manifest["architecture"]["position_offset"] == 2
    source = manifest["extra"]["converted_from"]
    assert source["architecture"] == "XLMRobertaModel" and source["reference"]["tokenizer"]["same_ids"]


def test_unsupported_configs_are_refused_naming_the_field(checkpoints, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for f in checkpoints["bert-st"].iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    (folder / "1_Pooling").mkdir()
    pooling = checkpoints["bert-st"] / "1_Pooling" / "config.json"
    (folder / "1_Pooling" / "config.json").write_text(pooling.read_text())
    config = json.loads((folder / "config.json").read_text())
    cases = [
        ("config.json", {**config, "position_embedding_type": "relative_key"}, "position_embedding_type"),
        ("config.json", {**config, "hidden_act": "mish"}, "hidden_act"),
        ("config.json", {**config, "architectures": ["BertForQuestionAnswering"]}, "architectures"),
        (
            "modules.json",
            [
                *json.loads((folder / "modules.json").read_text()),
                {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
            ],
            "Dense",
        ),
    ]
    for file, content, field in cases:
        original = (folder / file).read_text()
        (folder / file).write_text(json.dumps(content))
        with pytest.raises(ConversionError, match=field):
            convert(folder, tmp_path / "out" / "bad", name="bad")
        (folder / file).write_text(original)
        assert not (tmp_path / "out" / "bad").exists()


@pytest.mark.parametrize("layout", ["sharded-safetensors", "pytorch_model.bin"])
def test_weights_load_from_every_layout(layout, checkpoints, tmp_path):
    """A sharded safetensors folder (index + shards) and an old pytorch_model.bin give the same model."""
    source = checkpoints["bert-mlm"]
    folder = tmp_path / layout
    folder.mkdir()
    for f in source.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    hf = BertForMaskedLM.from_pretrained(source)
    if layout == "pytorch_model.bin":
        torch.save(hf.state_dict(), folder / "pytorch_model.bin")
    else:
        hf.save_pretrained(folder, max_shard_size="40KB")
        assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    want = load(source).model.state_dict()
    got = load(folder).model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_folder_without_weights_is_refused(checkpoints, tmp_path):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text((checkpoints["bert-mlm"] / "config.json").read_text())
    with pytest.raises(ConversionError, match="no weights"):
        load(folder)
    with pytest.raises(ConversionError, match="not a folder"):
        load(tmp_path / "missing")
