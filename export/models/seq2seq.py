"""Encoder-decoder Transformer for translation (English -> French).

References: Vaswani et al., "Attention Is All You Need" (2017); the Annotated Transformer
(`EncoderDecoder`, `subsequent_mask`, `greedy_decode`). Our trained translators differ from the
paper: pre-LN blocks with a final LayerNorm (trains stably without a long warm-up), one embedding
matrix shared by source, target and the output projection (one joint subword vocabulary). The
config's other settings (block norm position, final norms, activation, position layout, embedding
scale, a logits bias, the decoder start token) let converted checkpoints run on the same module:
Marian / OPUS-MT (export/convert/marian.py) is post-LN, SiLU, no final norms, sines-then-cosines
positions and a `final_logits_bias`, and starts decoding from its pad token.

The model exports as two graphs:
- `encode(src_ids, src_mask)` -> per decoder layer the cross-attention K/V of the encoder output,
  computed once per source and reused at every decoding step;
- `decode(tgt_ids, attention_mask, position_ids, past, cross_kv, src_mask)` -> logits and the
  present self-attention cache.
`greedy_decode` is the PyTorch reference without a cache that the ONNX loop must match.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from export.models.decoder import _init_weights
from export.models.layers import (
    POSITION_LAYOUTS,
    FeedForward,
    MultiHeadAttention,
    SinusoidalPositions,
    causal_mask,
    padding_mask,
)

KV = tuple[torch.Tensor, torch.Tensor]


NORM_POSITIONS = ("pre", "post")  # LayerNorm before each sub-layer (ours) | after its residual sum (Marian)


@dataclass
class Seq2SeqConfig:
    vocab_size: int = 8000
    d_model: int = 256
    n_encoder_layers: int = 4
    n_decoder_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    max_positions: int = 256
    dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2
    norm_position: str = "pre"  # NORM_POSITIONS
    final_norms: bool = True  # a LayerNorm after the encoder stack and one after the decoder stack
    activation: str = "gelu"  # feed-forward, a config.json name of layers.ACTIVATIONS
    positions: str = "interleaved"  # POSITION_LAYOUTS
    scale_embedding: bool = True  # token embeddings times sqrt(d_model) before the positions are added
    final_logits_bias: bool = False  # a (V,) buffer added to the logits
    decoder_start_token_id: int | None = None  # the first decoder input; None: bos_token_id

    def __post_init__(self):
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.bos_token_id
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position {self.norm_position!r}: one of {', '.join(NORM_POSITIONS)}")
        if self.positions not in POSITION_LAYOUTS:
            raise ValueError(f"positions {self.positions!r}: one of {', '.join(POSITION_LAYOUTS)}")


class _Block(nn.Module):
    """Sub-layer wiring: pre-LN x + f(LN(x)), or post-LN LN(x + f(x))."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        self.dropout = nn.Dropout(cfg.dropout)

    def _in(self, x, norm):
        return norm(x) if self.pre else x

    def _out(self, x, y, norm, dropout: bool = True):
        """The residual sum of x and a sub-layer's output y (B, T, C)."""
        x = x + (self.dropout(y) if dropout else y)  # the feed-forward applies its own dropout
        return x if self.pre else norm(x)


class EncoderLayer(_Block):
    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__(cfg)
        self.ln_attn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, dropout=cfg.dropout, activation=cfg.activation)

    def forward(self, x, mask):
        x = self._out(x, self.attn(self._in(x, self.ln_attn), mask)[0], self.ln_attn)
        return self._out(x, self.ffn(self._in(x, self.ln_ffn)), self.ln_ffn, dropout=False)


class DecoderLayer(_Block):
    """Masked self-attention (cached), cross-attention over the source, feed-forward."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__(cfg)
        self.ln_self = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_cross = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, dropout=cfg.dropout, activation=cfg.activation)

    def forward(self, x, self_mask, past, cross_kv, cross_mask):
        return self.run(x, lambda h: self.self_attn(h, self_mask, past=past), cross_kv, cross_mask)

    def run(self, x, attend, cross_kv, cross_mask):
        """The layer with its self-attention given as attend: normed x (B, T, C) -> (its output
        (B, T, C), present); the exported decoder (export/onnx/graphs.py) attends with
        GroupQueryAttention over a KV buffer through it, the rest of the wiring shared."""
        y, present = attend(self._in(x, self.ln_self))
        x = self._out(x, y, self.ln_self)
        y = self.cross_attn(self._in(x, self.ln_cross), cross_mask, memory_kv=cross_kv)[0]
        x = self._out(x, y, self.ln_cross)
        return self._out(x, self.ffn(self._in(x, self.ln_ffn)), self.ln_ffn, dropout=False), present


class Translator(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.positions = SinusoidalPositions(cfg.max_positions, cfg.d_model, cfg.positions)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.final_norms else nn.Identity()
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.final_norms else nn.Identity()
        bias = torch.zeros(cfg.vocab_size) if cfg.final_logits_bias else None  # (V,)
        self.register_buffer("final_logits_bias", bias)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        self.apply(_init_weights)

    def _embed(self, ids, position_ids):
        return self.drop(self.embed(ids) * self.embed_scale + self.positions(position_ids))

    def encode(self, src_ids, src_mask) -> list[KV]:
        """src_ids, src_mask (B, S) -> n_decoder_layers x cross-attention (k, v), each (B, nh, S, hs)."""
        S = src_ids.shape[1]
        x = self._embed(src_ids, torch.arange(S, device=src_ids.device)[None, :])  # (B, S, C)
        mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        memory = self.encoder_norm(x)  # (B, S, C)
        return [layer.cross_attn.project_kv(memory) for layer in cast(Iterable[DecoderLayer], self.decoder_layers)]

    def decode(self, tgt_ids, attention_mask, position_ids, past: list[KV] | None, cross_kv: list[KV], src_mask):
        """tgt_ids (B, T); attention_mask (B, P+T) over the target; position_ids (B, T);
        past: n_layers x (B, nh, P, hs); src_mask (B, S).
        Returns logits (B, T, V) and present: n_layers x (B, nh, P+T, hs)."""
        x = self._embed(tgt_ids, position_ids)  # (B, T, C)
        self_mask = causal_mask(attention_mask, tgt_ids.shape[1], x.dtype)  # (B, 1, T, P+T)
        cross_mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
        present = []
        for i, layer in enumerate(self.decoder_layers):
            x, kv = layer(x, self_mask, past[i] if past else None, cross_kv[i], cross_mask)
            present.append(kv)
        return self.project(x), present

    def project(self, x):
        """The decoder stack's output (B, T, C) -> logits (B, T, V): final norm, the shared table."""
        logits = self.decoder_norm(x) @ self.embed.weight.T  # (B, T, V)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias

    def forward(self, src_ids, src_mask, tgt_ids, tgt_mask):
        """Teacher-forced training pass: logits (B, T, V) for every target position."""
        T = tgt_ids.shape[1]
        positions = torch.arange(T, device=tgt_ids.device)[None, :].expand_as(tgt_ids)
        logits, _ = self.decode(tgt_ids, tgt_mask, positions, None, self.encode(src_ids, src_mask), src_mask)
        return logits

    @torch.no_grad()
    def greedy_decode(self, src_ids, src_mask, max_length: int) -> list[list[int]]:
        """Reference without a cache: re-decodes the whole prefix each step. Returns token ids per
        source, without the decoder start token, up to and including EOS."""
        cross = self.encode(src_ids, src_mask)
        B = src_ids.shape[0]
        start = cast(int, self.config.decoder_start_token_id)  # never None after __post_init__
        ys = torch.full((B, 1), start, dtype=torch.long, device=src_ids.device)
        done = torch.zeros(B, dtype=torch.bool, device=src_ids.device)
        for _ in range(max_length):
            positions = torch.arange(ys.shape[1], device=ys.device)[None, :].expand_as(ys)
            logits, _ = self.decode(ys, torch.ones_like(ys), positions, None, cross, src_mask)
            nxt = logits[:, -1].argmax(dim=-1)  # (B,)
            nxt = torch.where(done, torch.full_like(nxt, self.config.pad_token_id), nxt)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            done |= nxt == self.config.eos_token_id
            if bool(done.all()):
                break
        out = []
        for row in ys[:, 1:].tolist():
            out.append(row[: row.index(self.config.eos_token_id) + 1] if self.config.eos_token_id in row else row)
        return out

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
