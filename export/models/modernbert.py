"""ModernBERT: a pre-norm encoder with rotary positions, GeGLU and alternating global / local attention.

References: Warner et al., "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder"
(ModernBERT, 2024) and Hugging Face's `modeling_modernbert.py`, whose computation this follows:
token embeddings -> LayerNorm (no positions there); per layer x = x + Attn(LN(x)) (layer 0 without
that LN), x = x + GeGLU(LN(x)); a final LayerNorm. Attention has rotary positions (Su et al.,
"RoFormer", 2021; halves, as in `rotate_half`) with one theta for global layers and another for
local ones; every `global_attn_every_n_layers`-th layer attends globally, the others within a
window: a token sees the tokens at most `local_window // 2` positions away. No biases by default,
LayerNorms without bias. The heads: a prediction head (dense -> activation -> LayerNorm) before the
tied decoder (masked LM) or before the classifier, on [CLS] or the mean of the tokens
(`classifier_pooling`).

Two forms of every forward, the same modules: padded (`padded_hidden`: right-padded rows, a key
mask, positions 0..T-1) and packed (`packed_hidden`: several inputs per row as
export/onnx/packed.py lays them out, attention within each input's segment, positions from each
input's start). The window is measured in positions, so it holds in both. The module names are
ours, mapped from a Hugging Face state dict by export/convert/modernbert.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from export.models.classifier import HeadConfig
from export.models.decoder import rotate_half
from export.models.layers import ACTIVATIONS, FeedForward, MultiHeadAttention, pool_tokens, same_segment

LAYER_TYPES = ("full_attention", "sliding_attention")
POOLINGS = ("cls", "mean")  # classifier_pooling


@dataclass
class ModernBertConfig:
    vocab_size: int = 50368
    d_model: int = 768
    n_layers: int = 22
    n_heads: int = 12
    d_ff: int = 1152
    max_positions: int = 8192
    layer_norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    activation: str = "gelu"  # hidden_activation (export.models.layers.ACTIVATIONS)
    layer_types: list[str] = field(default_factory=list)  # one of LAYER_TYPES per layer
    local_window: int = 128  # local_attention: a sliding layer's token sees +- local_window // 2
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    pooling: str = "mean"  # embedding: "mean", "cls" or "max" (sentence-transformers' Pooling)
    max_length: int = 8192  # tokens the model is used with
    pad_token_id: int = 50283
    head_activation: str = "gelu"  # classifier_activation: the prediction head's
    head_bias: bool = False  # classifier_bias: the prediction head's dense
    classifier_pooling: str = "cls"  # POOLINGS

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean "may attend" -> additive mask: 0 where allowed, the dtype's minimum where not."""
    return (1.0 - allowed.to(dtype)) * torch.finfo(dtype).min


def window(position_ids: torch.Tensor, half: int) -> torch.Tensor:
    """(B, T) positions -> (B, 1, T, T): query and key at most `half` positions apart."""
    apart = (position_ids[:, :, None] - position_ids[:, None, :]).abs()  # (B, T, T)
    return (apart <= half)[:, None]


class Rotary(nn.Module):
    """Rotary positions computed from position ids, as transformers computes them (no table);
    `forward` is the `MultiHeadAttention.rotate` hook."""

    inv_freq: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, q, k, position_ids):
        """q, k (B, nh, T, hs) -> both rotated by their positions (B, T)."""
        freqs = position_ids[..., None].float() * self.inv_freq  # (B, T, hs/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hs)
        cos, sin = emb.cos(), emb.sin()
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Embeddings(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)

    def forward(self, input_ids):
        return self.norm(self.word(input_ids))  # (B, T, C)


class ModernBertBlock(nn.Module):
    """x = x + Attn(LN(x)) (layer 0: no LN); x = x + GeGLU(LN(x))."""

    def __init__(self, cfg: ModernBertConfig, index: int):
        super().__init__()
        self.local = cfg.layer_types[index] == "sliding_attention"
        eps, bias = cfg.layer_norm_eps, cfg.norm_bias
        self.ln_attn = nn.Identity() if index == 0 else nn.LayerNorm(cfg.d_model, eps=eps, bias=bias)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, bias=cfg.attention_bias)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=eps, bias=bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias, activation=cfg.activation, gated=True)

    def forward(self, x, mask, rotate, position_ids):
        x = x + self.attn(self.ln_attn(x), mask, rotate=rotate, position_ids=position_ids)[0]
        return x + self.ffn(self.ln_ffn(x))


class ModernBertEncoder(nn.Module):
    """Token states (`padded_hidden`, `packed_hidden`) and the pooled sentence embedding (`forward`)."""

    architecture_type = "modernbert-encoder"  # the manifest's architecture type

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = nn.ModuleList(ModernBertBlock(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)
        self.global_rotary = Rotary(cfg.head_dim, cfg.global_rope_theta)
        self.local_rotary = Rotary(cfg.head_dim, cfg.local_rope_theta)

    def hidden(self, input_ids, position_ids, allowed):
        """allowed: bool (B, 1, 1 or T, T), which keys each query may see (padding, segments);
        sliding layers further keep keys within the window of the query's position."""
        x = self.embeddings(input_ids)  # (B, T, C)
        full = additive(allowed, x.dtype)
        local = additive(allowed & window(position_ids, self.config.local_window // 2), x.dtype)  # (B, 1, T, T)
        for block in self.blocks:
            if block.local:
                x = block(x, local, self.local_rotary, position_ids)
            else:
                x = block(x, full, self.global_rotary, position_ids)
        return self.final_norm(x)  # (B, T, C)

    def padded_hidden(self, input_ids, attention_mask, token_type_ids=None):
        """Right-padded rows (B, T) -> token states (B, T, C); ModernBERT has no token types."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]  # (1, T)
        return self.hidden(input_ids, positions, attention_mask[:, None, None, :].to(torch.bool))

    def packed_hidden(self, input_ids, position_ids, segment_ids, token_type_ids=None):
        """Packed rows (R, L) -> token states (R, L, C), each token attending within its segment."""
        return self.hidden(input_ids, position_ids, same_segment(segment_ids))

    def token_embeddings(self, input_ids, attention_mask, token_type_ids=None):
        return self.padded_hidden(input_ids, attention_mask)

    def pool(self, tokens, attention_mask):
        return pool_tokens(tokens, attention_mask, self.config.pooling)  # (B, C)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """-> (B, C) pooled sentence embeddings, not normalised (the service normalises)."""
        return self.pool(self.padded_hidden(input_ids, attention_mask), attention_mask)


class PredictionHead(nn.Module):
    """dense -> activation -> LayerNorm, before the decoder or the classifier."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.head_bias)
        self.act = ACTIVATIONS[cfg.head_activation]
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)

    def forward(self, x):
        return self.norm(self.act(self.dense(x)))


class MLMHead(nn.Module):
    """hidden (..., C) -> logits (..., V) through the tied token embedding plus the decoder's bias
    (zeros for a folder without `decoder_bias`)."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.transform = PredictionHead(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden, embedding_weight):
        return self.transform(hidden) @ embedding_weight.T + self.bias  # (..., V)


class ModernBertMaskedLM(nn.Module):
    """The encoder's token states -> the prediction head -> the tied decoder: logits over the vocabulary."""

    architecture_type = "modernbert-mlm"  # the manifest's architecture type

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.config = cfg
        self.encoder = ModernBertEncoder(cfg)
        self.head = MLMHead(cfg)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """-> (B, T, V) logits at every position."""
        return self.head(self.encoder.padded_hidden(input_ids, attention_mask), self.encoder.embeddings.word.weight)


class ModernBertClassifier(nn.Module):
    """Pooled tokens ([CLS] or mean, `classifier_pooling`) -> prediction head -> classifier -> logits (B, L)."""

    architecture_type = "modernbert-classifier"  # the manifest's architecture type

    def __init__(self, cfg: ModernBertConfig, head: HeadConfig):
        super().__init__()
        self.config, self.head_config = cfg, head
        self.encoder = ModernBertEncoder(cfg)
        self.head = PredictionHead(cfg)
        self.classifier = nn.Linear(cfg.d_model, head.num_labels)

    def classify(self, tokens, attention_mask):
        """Token states (B, T, C) of right-padded rows -> logits (B, L)."""
        if self.config.classifier_pooling == "cls":
            pooled = tokens[:, 0]  # (B, C)
        else:
            weights = attention_mask.to(tokens.dtype)[:, :, None]  # (B, T, 1)
            pooled = (tokens * weights).sum(1) / weights.sum(1)
        return self.classifier(self.head(pooled))

    def classify_packed(self, tokens, segment_ids, first_index):
        """Token states (R, L, C) of packed rows, each input's first flat index (B,) -> logits (B, L)."""
        flat = tokens.reshape(-1, tokens.shape[-1])  # (R*L, C)
        if self.config.classifier_pooling == "cls":
            return self.classifier(self.head(flat[first_index]))
        length = segment_ids.shape[1]
        segments = segment_ids.reshape(-1)  # (R*L,)
        rows = torch.arange(segments.shape[0], device=segments.device) // length  # (R*L,)
        member = (rows[None, :] == (first_index // length)[:, None]) & (
            segments[None, :] == segments[first_index][:, None]
        )  # (B, R*L): the tokens of each input
        weights = member.to(flat.dtype)
        return self.classifier(self.head((weights @ flat) / weights.sum(-1, keepdim=True)))

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """-> (B, L) logits, before any activation."""
        return self.classify(self.encoder.padded_hidden(input_ids, attention_mask), attention_mask)
