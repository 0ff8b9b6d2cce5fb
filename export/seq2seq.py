"""Encoder-decoder Transformer for translation (English -> French).

References: Vaswani et al., "Attention Is All You Need" (2017); the Annotated Transformer
(`EncoderDecoder`, `subsequent_mask`, `greedy_decode`). Differences from the paper: pre-LN blocks
with a final LayerNorm (trains stably without a long warm-up), one embedding matrix shared by
source, target and the output projection (one joint subword vocabulary), sinusoidal positions.

The model exports as two graphs:
- `encode(src_ids, src_mask)` -> per decoder layer the cross-attention K/V of the encoder output,
  computed once per source and reused at every decoding step;
- `decode(tgt_ids, attention_mask, position_ids, past, cross_kv, src_mask)` -> logits and the
  present self-attention cache.
`greedy_decode` is the PyTorch reference without a cache that the ONNX loop must match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from export.decoder import _init_weights
from export.layers import FeedForward, MultiHeadAttention, SinusoidalPositions, causal_mask, padding_mask

KV = tuple[torch.Tensor, torch.Tensor]


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


class EncoderLayer(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, dropout=cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask):
        x = x + self.dropout(self.attn(self.ln_attn(x), mask)[0])
        return x + self.ffn(self.ln_ffn(x))


class DecoderLayer(nn.Module):
    """Pre-LN: masked self-attention (cached), cross-attention over the source, feed-forward."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.ln_self = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_cross = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, dropout=cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, self_mask, past, cross_kv, cross_mask):
        y, present = self.self_attn(self.ln_self(x), self_mask, past=past)
        x = x + self.dropout(y)
        x = x + self.dropout(self.cross_attn(self.ln_cross(x), cross_mask, memory_kv=cross_kv)[0])
        return x + self.ffn(self.ln_ffn(x)), present


class Translator(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
        self.positions = SinusoidalPositions(cfg.max_positions, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.apply(_init_weights)

    def _embed(self, ids, position_ids):
        return self.drop(self.embed(ids) * math.sqrt(self.config.d_model) + self.positions(position_ids))

    def encode(self, src_ids, src_mask) -> list[KV]:
        """src_ids, src_mask (B, S) -> n_decoder_layers x cross-attention (k, v), each (B, nh, S, hs)."""
        S = src_ids.shape[1]
        x = self._embed(src_ids, torch.arange(S, device=src_ids.device)[None, :])  # (B, S, C)
        mask = padding_mask(src_mask, x.dtype)  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        memory = self.encoder_norm(x)  # (B, S, C)
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder_layers]

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
        return self.decoder_norm(x) @ self.embed.weight.T, present  # (B, T, V)

    def forward(self, src_ids, src_mask, tgt_ids, tgt_mask):
        """Teacher-forced training pass: logits (B, T, V) for every target position."""
        T = tgt_ids.shape[1]
        positions = torch.arange(T, device=tgt_ids.device)[None, :].expand_as(tgt_ids)
        logits, _ = self.decode(tgt_ids, tgt_mask, positions, None, self.encode(src_ids, src_mask), src_mask)
        return logits

    @torch.no_grad()
    def greedy_decode(self, src_ids, src_mask, max_length: int) -> list[list[int]]:
        """Reference without a cache: re-decodes the whole prefix each step. Returns token ids per
        source, without BOS, up to and including EOS."""
        cross = self.encode(src_ids, src_mask)
        B = src_ids.shape[0]
        ys = torch.full((B, 1), self.config.bos_token_id, dtype=torch.long, device=src_ids.device)
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
