"""BERT-style masked language model: the project's encoder (export/models/encoder.py) with a tied MLM head.

References: Devlin et al., "BERT" (2019), section 3.1 and appendix A.1: the encoder's final
hidden states go through a transform (dense -> GELU -> LayerNorm) and a decoder to the
vocabulary whose weight matrix is the token embedding (tied, as in Press & Wolf, "Using the
Output Embedding to Improve Language Models", 2017) plus its own output bias. Lan et al.,
"ALBERT" (2020), section 4.1, for sentence-order prediction (SOP), the optional second
objective (the `sop` classifier on [CLS], training only; the fill-mask graph exports the MLM logits alone).

`forward(input_ids, attention_mask)` -> (B, T, V) logits at every position; the model
directory's kind "fill-mask" exports exactly that (export/onnx/fill_mask.py). Module names mirror
Hugging Face BertForMaskedLM's `cls.predictions.{transform,decoder,bias}` in spirit.

`SpladeEncoder` turns the same model into a sparse embedder (kind "sparse-embedding"): Formal et
al., "SPLADE v2" (2021), eq. 1 with max pooling: w_j = max_i log(1 + ReLU(logit_ij)) over the real
tokens i, one weight per vocabulary entry j, as sentence-transformers' `SpladePooling` computes it
(pooling "max" or "sum", activation "relu" or "log1p_relu", its second log1p).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from export.models.encoder import EncoderConfig, SentenceEncoder
from export.models.layers import ACTIVATIONS


class MLMHead(nn.Module):
    """hidden (B, T, C) -> logits (B, T, V) with the decoder weight tied to the token embedding."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, hidden, embedding_weight):
        """embedding_weight: the encoder's token embedding (V, C), passed in rather than held, so
        the state dict stores it once (safetensors refuses shared tensors)."""
        h = self.norm(self.act(self.dense(hidden)))  # (B, T, C)
        return h @ embedding_weight.T + self.bias  # (B, T, V)


class MaskedLM(nn.Module):
    """Encoder + MLM head (+ a two-way SOP classifier on [CLS], used only when trained with --sop)."""

    architecture_type = "bert-mlm"  # the manifest's architecture type

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.config = cfg
        self.encoder = SentenceEncoder(cfg)
        self.head = MLMHead(cfg)
        self.sop = nn.Linear(cfg.d_model, 2)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        """BERT's initialisation: normal(0, 0.02) weights, zero biases, unit LayerNorms."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            nn.init.zeros_(module.weight[module.padding_idx])
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def hidden(self, input_ids, attention_mask, token_type_ids=None):
        return self.encoder.token_embeddings(input_ids, attention_mask, token_type_ids)  # (B, T, C)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """-> (B, T, V) MLM logits at every position."""
        return self.head(self.hidden(input_ids, attention_mask, token_type_ids), self.encoder.embeddings.word.weight)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


SPLADE_POOLINGS = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass
class SpladeConfig:
    pooling: str = "max"  # SPLADE_POOLINGS
    activation: str = "relu"  # SPLADE_ACTIVATIONS


class SpladeEncoder(nn.Module):
    """A masked LM whose logits are pooled into one (B, V) vocabulary-weight vector per input."""

    def __init__(self, cfg: EncoderConfig, splade: SpladeConfig):
        super().__init__()
        self.config, self.splade = cfg, splade
        self.mlm = MaskedLM(cfg)

    def forward(self, input_ids, attention_mask):
        """-> (B, V) weights, >= 0."""
        return self.pool(self.mlm(input_ids, attention_mask), attention_mask)

    def pool(self, logits, attention_mask):
        """(B, T, V) logits -> (B, V); padded positions count as 0, as SpladePooling masks them."""
        weights = torch.log1p(torch.relu(logits * attention_mask[:, :, None].to(logits.dtype)))  # (B, T, V)
        if self.splade.activation == "log1p_relu":
            weights = torch.log1p(weights)
        return weights.amax(dim=1) if self.splade.pooling == "max" else weights.sum(dim=1)  # (B, V)
