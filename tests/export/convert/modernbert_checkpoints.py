"""Tiny random-weight ModernBERT folders, built offline with transformers (config + `save_pretrained`).

Four layers, every third global (global, local, local, global) and a local window of WINDOW = 8
tokens (a token sees 4 on each side), smaller than the test texts, so a wrong window mask changes
the outputs. The tokenizer is the trained WordPiece of the other encoder tests with ModernBERT's
`[CLS] A [SEP] B [SEP]` template and no token types (ModernBERT's tokenizer_config names
`input_ids` and `attention_mask` only).
- `mb-embed`: a `ModernBertModel` sentence-transformers folder, mean pooling, normalised, with
  modernbert-embed's instruction prompts (`search_query: `, `search_document: `).
- `mb-gte`: the same shape with CLS pooling, as gte-modernbert.
- `mb-mlm`: `ModernBertForMaskedLM` (its decoder tied, with bias).
- `mb-cls3`: `ModernBertForSequenceClassification`, three labels, `classifier_pooling` mean.
- `mb-ce`: one label, `classifier_pooling` cls (a reranker's shape).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import decoders, processors
from transformers import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertModel,
    PreTrainedTokenizerFast,
)

from tests.export.convert.test_convert_encoders import sentence_transformers_folder, trained_wordpiece, widen

WINDOW = 8
PROMPTS = {"query": "search_query: ", "document": "search_document: "}
LABELS3 = {0: "negative", 1: "neutral", 2: "positive"}


def tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    tok = trained_wordpiece()
    specials = [(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=specials
    )
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.save_pretrained(folder)
    return fast


def config(tok: PreTrainedTokenizerFast, **extra) -> ModernBertConfig:
    cls, sep = tok.cls_token_id, tok.sep_token_id
    return ModernBertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=128,
        global_attn_every_n_layers=3,
        local_attention=WINDOW,
        pad_token_id=tok.pad_token_id,
        cls_token_id=cls,
        sep_token_id=sep,
        bos_token_id=cls,
        eos_token_id=sep,
        **extra,
    )


def _embedder(folder: Path, pooling: str, prompts: dict | None) -> None:
    tok = tokenizer(folder)
    widen(ModernBertModel(config(tok))).save_pretrained(folder)
    sentence_transformers_folder(folder, pooling)
    if prompts:
        st = {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}
        (folder / "config_sentence_transformers.json").write_text(json.dumps(st))


def build(root: Path) -> dict[str, Path]:
    """The folders (module doc) under root, by name."""
    folders = {name: root / name for name in ("mb-embed", "mb-gte", "mb-mlm", "mb-cls3", "mb-ce")}
    _embedder(folders["mb-embed"], "mean", PROMPTS)
    _embedder(folders["mb-gte"], "cls", None)
    tok = tokenizer(folders["mb-mlm"])
    widen(ModernBertForMaskedLM(config(tok))).save_pretrained(folders["mb-mlm"])
    tok = tokenizer(folders["mb-cls3"])
    labels = {"id2label": LABELS3, "label2id": {v: k for k, v in LABELS3.items()}}
    cfg = config(tok, classifier_pooling="mean", **labels)
    widen(ModernBertForSequenceClassification(cfg)).save_pretrained(folders["mb-cls3"])
    tok = tokenizer(folders["mb-ce"])
    cfg = config(tok, classifier_pooling="cls", num_labels=1)
    widen(ModernBertForSequenceClassification(cfg)).save_pretrained(folders["mb-ce"])
    return folders
