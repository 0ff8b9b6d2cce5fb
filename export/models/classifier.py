"""Sequence classifier / cross-encoder: the project's encoder (export/models/encoder.py) with a classification head.

References: Devlin et al., "BERT" (2019), section 4.1: the final hidden state of [CLS] through
the pooler (dense + tanh) and a linear classifier over the labels; Liu et al., "RoBERTa" (2019)
and Hugging Face's `RobertaClassificationHead` (dense + tanh + out_proj on `<s>`), which is the
same computation under other names; Nogueira & Cho, "Passage Re-ranking with BERT" (2019) for
the cross-encoder: query and passage as one pair input, one relevance logit.

`forward(input_ids, attention_mask, token_type_ids)` -> logits (B, num_labels), before any
activation: the service applies the manifest's `activation` (sigmoid for one label, softmax for
several, or none) unless the caller asks for raw scores. Its graphs: export/onnx/classifier.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from export.models.encoder import EncoderConfig, SentenceEncoder

ACTIVATIONS = ("sigmoid", "softmax", "none")  # what the service applies to the logits
TRUNCATIONS = ("longest_first", "only_second")  # how a pair past the limit is cut (transformers' names)


@dataclass
class HeadConfig:
    labels: list[str] = field(default_factory=lambda: ["LABEL_0"])  # id2label, in id order
    activation: str = "sigmoid"  # ACTIVATIONS
    token_types: bool = True  # the graph takes token_type_ids (the tokenizer gives them)
    truncation: str = "longest_first"  # TRUNCATIONS: only_second keeps the query whole, cuts the document

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
    architecture_type = "bert-classifier"  # the manifest's architecture type

    def __init__(self, cfg: EncoderConfig, head: HeadConfig):
        super().__init__()
        self.config, self.head_config = cfg, head
        self.encoder = SentenceEncoder(cfg)
        self.head = ClassificationHead(cfg.d_model, head.num_labels)

    def classify(self, tokens, attention_mask):
        """Token states (B, T, C) of right-padded rows -> logits (B, L): the first token's."""
        return self.head(tokens[:, 0])

    def classify_packed(self, tokens, segment_ids, first_index):
        """Token states (R, L, C) of packed rows, each input's first flat index (B,) -> logits (B, L)."""
        return self.head(tokens.reshape(-1, tokens.shape[-1])[first_index])

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """-> (B, L) logits."""
        tokens = self.encoder.token_embeddings(input_ids, attention_mask, token_type_ids)  # (B, T, C)
        return self.classify(tokens, attention_mask)
