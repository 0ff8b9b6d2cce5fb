"""BERT-style sentence encoder (the all-MiniLM-L6-v2 family).

References: Devlin et al., "BERT" (2019) for the post-LN encoder with token + position +
token-type embeddings; Reimers & Gurevych, "Sentence-BERT" (2019) for mean pooling over the
attention mask followed by L2 normalisation. The module names map one-to-one onto a Hugging Face
BertModel state dict (see `export.convert.minilm.load_minilm`).

`forward` returns the pooled, *unnormalised* sentence embedding: the service normalises (and can
truncate dimensions first, Matryoshka-style), so the graph must not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from export.models.layers import FeedForward, MultiHeadAttention, padding_mask, pool_tokens, segment_mask


@dataclass
class EncoderConfig:
    vocab_size: int = 30522
    d_model: int = 384
    n_layers: int = 6
    n_heads: int = 12
    d_ff: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pooling: str = "mean"  # "mean" over the attention mask, "cls", or "max" over the real tokens
    max_length: int = 256  # word pieces the model is used with (sentence-transformers' max_seq_length)
    pad_token_id: int = 0
    activation: str = "gelu"  # config.json's hidden_act (export.models.layers.ACTIVATIONS)
    position_offset: int = 0  # the first token's position id: RoBERTa / XLM-R start at padding_idx + 1


class Embeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.position = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.offset = cfg.position_offset  # right-padded rows: RoBERTa's cumsum positions are this + arange

    def forward(self, input_ids, token_type_ids, position_ids=None):
        """position_ids (B, T): each token's position counted from 0 (packed rows, export/onnx/packed.py);
        None: 0..T-1 for every row."""
        T = input_ids.shape[1]
        positions = torch.arange(T, device=input_ids.device)[None, :] if position_ids is None else position_ids
        if self.offset:  # traced as a constant: offset 0 leaves BERT's graph (and its fusions) as it was
            positions = positions + self.offset
        x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        return self.norm(x)  # (B, T, C)


class EncoderBlock(nn.Module):
    """Post-LN block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_attn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, activation=cfg.activation)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def forward(self, x, mask):
        x = self.ln_attn(x + self.attn(x, mask)[0])
        return self.ln_ffn(x + self.ffn(x))


class SentenceEncoder(nn.Module):
    architecture_type = "bert-encoder"  # the manifest's architecture type

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.n_layers))

    def token_embeddings(self, input_ids, attention_mask, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, C)
        mask = padding_mask(attention_mask, x.dtype)  # (B, 1, 1, T)
        for block in self.blocks:
            x = block(x, mask)
        return x

    def padded_hidden(self, input_ids, attention_mask, token_type_ids=None):
        """`token_embeddings` as the graphs compute it: the additive padding mask written
        `(1 - mask) * min` (Hugging Face BERT's form, equal to `padding_mask`), the pattern
        onnxruntime's optimizer recognises to fuse Attention and EmbedLayerNormalization."""
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.embeddings(input_ids, types)  # (B, T, C)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min  # (B, 1, 1, T)
        for block in self.blocks:
            x = block(x, mask)
        return x

    def packed_hidden(self, input_ids, position_ids, segment_ids, token_type_ids=None):
        """Packed rows (R, L) (export/onnx/packed.py) -> token states (R, L, C), attention within each segment."""
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.embeddings(input_ids, types, position_ids)  # (R, L, C)
        mask = segment_mask(segment_ids, x.dtype)  # (R, 1, L, L)
        for block in self.blocks:
            x = block(x, mask)
        return x

    def pool(self, tokens, attention_mask):
        return pool_tokens(tokens, attention_mask, self.config.pooling)  # (B, C)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        """-> (B, C) pooled sentence embeddings, not normalised."""
        return self.pool(self.token_embeddings(input_ids, attention_mask, token_type_ids), attention_mask)

    @torch.no_grad()
    def embed(self, input_ids, attention_mask) -> torch.Tensor:
        """Reference embeddings: pooled then L2-normalised, as sentence-transformers returns them."""
        return F.normalize(self(input_ids, attention_mask), p=2, dim=-1)
