"""Sequence classifier / cross-encoder: the project's encoder (export/encoder.py) with a classification head.

References: Devlin et al., "BERT" (2019), section 4.1: the final hidden state of [CLS] through
the pooler (dense + tanh) and a linear classifier over the labels; Liu et al., "RoBERTa" (2019)
and Hugging Face's `RobertaClassificationHead` (dense + tanh + out_proj on `<s>`), which is the
same computation under other names; Nogueira & Cho, "Passage Re-ranking with BERT" (2019) for
the cross-encoder: query and passage as one pair input, one relevance logit.

`forward(input_ids, attention_mask, token_type_ids)` -> logits (B, num_labels), before any
activation: the service applies the manifest's `activation` (sigmoid for one label, softmax for
several, or none) unless the caller asks for raw scores. The exported graph (role `encoder`) takes
token_type_ids only when the tokenizer produces them (BERT pairs: 0 for the first text, 1 for the
second; RoBERTa and XLM-R use one type). The packed graph (role `packed`, export/packed.py's rows:
several inputs per row, attention kept within each) also takes `first_index`, the flat position of
each input's first token, and returns the logits of each input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from export import onnx_export as ox
from export.encoder import EncoderConfig, SentenceEncoder
from export.packed import segment_mask
from service.engine.packing import pack
from service.manifest import TensorSpec

ACTIVATIONS = ("sigmoid", "softmax", "none")  # what the service applies to the logits


@dataclass
class HeadConfig:
    labels: list[str] = field(default_factory=lambda: ["LABEL_0"])  # id2label, in id order
    activation: str = "sigmoid"  # ACTIVATIONS
    token_types: bool = True  # the graph takes token_type_ids (the tokenizer gives them)

    @property
    def num_labels(self) -> int:
        return len(self.labels)


class ClassificationHead(nn.Module):
    """The first token's hidden state (B, C) -> dense -> tanh -> out -> logits (B, L)."""

    def __init__(self, d_model: int, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, num_labels)

    def forward(self, first):
        return self.out(torch.tanh(self.dense(first)))  # (B, L)


class SequenceClassifier(nn.Module):
    def __init__(self, cfg: EncoderConfig, head: HeadConfig):
        super().__init__()
        self.config, self.head_config = cfg, head
        self.encoder = SentenceEncoder(cfg)
        self.head = ClassificationHead(cfg.d_model, head.num_labels)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """-> (B, L) logits."""
        tokens = self.encoder.token_embeddings(input_ids, attention_mask, token_type_ids)  # (B, T, C)
        return self.head(tokens[:, 0])


class ClassifierGraph(nn.Module):
    """What the `encoder` graph computes: SequenceClassifier.forward with the padding mask written
    `(1 - mask) * min`, the form onnxruntime's optimizer fuses (onnx_export.EncoderGraph)."""

    def __init__(self, model: SequenceClassifier):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        enc = self.model.encoder
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = enc.embeddings(input_ids, types)  # (B, T, C)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min  # (B, 1, 1, T)
        for block in enc.blocks:
            x = block(x, mask)
        return self.model.head(x[:, 0])  # (B, L)


def classifier_specs(model: SequenceClassifier) -> tuple[list[TensorSpec], list[TensorSpec]]:
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if model.head_config.token_types else [])
    inputs = [TensorSpec(n, "int64", ["batch", "sequence"]) for n in names]
    return inputs, [TensorSpec("logits", "float32", ["batch", model.head_config.num_labels])]


def export_classifier(model: SequenceClassifier, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs, outputs = classifier_specs(model)
    ids = ox._example_ids(model.config.vocab_size, ox._B, ox._T)
    args = (ids, torch.ones_like(ids)) + ((torch.zeros_like(ids),) if model.head_config.token_types else ())
    ox._export(ClassifierGraph(model), args, path, inputs, outputs)
    return inputs, outputs


class PackedClassifierGraph(nn.Module):
    """(input_ids, position_ids, segment_ids[, token_type_ids]) (R, L) and first_index (B,) -> logits (B, L)."""

    def __init__(self, model: SequenceClassifier):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, segment_ids, first_index, token_type_ids=None):
        enc = self.model.encoder
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = enc.embeddings(input_ids, types, position_ids)  # (R, L, C)
        mask = segment_mask(segment_ids, x.dtype)  # (R, 1, L, L)
        for block in enc.blocks:
            x = block(x, mask)
        first = x.reshape(-1, x.shape[-1])[first_index]  # (B, C)
        return self.model.head(first)  # (B, labels)


def packed_specs(model: SequenceClassifier) -> tuple[list[TensorSpec], list[TensorSpec]]:
    names = ["input_ids", "position_ids", "segment_ids"]
    inputs = [TensorSpec(n, "int64", ["rows", "length"]) for n in names]
    inputs.append(TensorSpec("first_index", "int64", ["batch"]))
    if model.head_config.token_types:
        inputs.append(TensorSpec("token_type_ids", "int64", ["rows", "length"]))
    return inputs, [TensorSpec("logits", "float32", ["batch", model.head_config.num_labels])]


def export_packed_classifier(model: SequenceClassifier, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Traced on two rows of distinct segments and lengths (no axis frozen to an example size)."""
    inputs, outputs = packed_specs(model)
    example = pack([list(range(3, 8)), list(range(3, 6)), list(range(3, 10))], 9, model.config.pad_token_id)
    args = [torch.from_numpy(a) for a in (example.input_ids, example.position_ids, example.segment_ids)]
    args.append(torch.from_numpy(example.row * example.input_ids.shape[1] + example.start))
    if model.head_config.token_types:
        args.append(torch.from_numpy((example.position_ids > 2).astype("int64")))  # (R, L): both types
    ox._export(PackedClassifierGraph(model), tuple(args), path, inputs, outputs)
    return inputs, outputs
