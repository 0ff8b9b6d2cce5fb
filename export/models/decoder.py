"""Decoder-only language model with a KV cache: GPT-2's block, and Llama's (which Mistral, Qwen2 and Qwen3 share).

References: Radford et al., "Language Models are Unsupervised Multitask Learners" (GPT-2, 2019)
for the pre-LN block, learned positions and tied embeddings; Karpathy's nanoGPT `model.py` for the
layout; Touvron et al., "LLaMA" (2023) for the converted variant (export/convert/llama.py): RMSNorm,
rotary positions (Su et al., "RoFormer", 2021, halves not interleaved as in Hugging Face's Llama),
SwiGLU, grouped-query attention and an untied head; Qwen3 adds an RMSNorm over each head's query
and key before rotary (`qk_norm`). `DecoderConfig`'s defaults are GPT's.

Unlike nanoGPT, `forward` takes an attention mask over past + new positions and explicit position
ids, so rows of different lengths share one batch, and returns the present KV cache. `generate` is
the PyTorch greedy reference (over that cache) whose tokens the ONNX KV-cache loop must reproduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from export.models.layers import FeedForward, MultiHeadAttention, causal_mask, norm

Past = list[tuple[torch.Tensor, torch.Tensor]]

NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary")


@dataclass
class DecoderConfig:
    vocab_size: int = 8192
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 1024
    max_positions: int = 512  # the context: learned positions, or the rows of the rotary table
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    bos_token_id: int = 0
    eos_token_id: int = 0
    pad_token_id: int = 0
    norm: str = "layernorm"  # NORMS
    norm_bias: bool = True  # layernorm only
    activation: str = "gelu"  # export.models.layers.ACTIVATIONS
    gated_mlp: bool = False  # SwiGLU: act(gate(x)) * fc_in(x)
    mlp_bias: bool = True
    qkv_bias: bool = True
    out_bias: bool = True
    n_kv_heads: int | None = None  # < n_heads: grouped-query attention; None: n_heads
    head_dim: int | None = None  # None: d_model // n_heads
    qk_norm: bool = False  # RMSNorm over each head's query and key before rotary (Qwen3)
    positions: str = "learned"  # POSITIONS
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": one of ROPE_TYPES, its parameters}
    tied_head: bool = True  # logits through wte's weights, else an lm_head Linear

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


# ---- rotary positions ---------------------------------------------------------------------------


def _linear(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    return inv_freq / p["factor"]


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    """Llama 3.1's frequency-dependent interpolation (transformers' `_compute_llama3_parameters`)."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


# rope_type -> (the parameters it needs, inv_freq -> scaled inv_freq); cos / sin are not rescaled.
ROPE_TYPES = {
    "default": ((), lambda inv_freq, p: inv_freq),
    "linear": (("factor",), _linear),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), _llama3),
}


def rope_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """inv_freq (head_dim / 2,) in fp32, as transformers computes it."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = scaling or {"rope_type": "default"}
    return ROPE_TYPES[scaling["rope_type"]][1](inv_freq, scaling)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(nn.Module):
    """cos / sin tables (max_positions, hs), looked up by position id; `forward` is the
    `MultiHeadAttention.rotate` hook."""

    cos: torch.Tensor  # buffers, registered in __init__
    sin: torch.Tensor

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        inv_freq = rope_frequencies(cfg.head_size, cfg.rope_theta, cfg.rope_scaling)
        freqs = torch.arange(cfg.max_positions).float()[:, None] * inv_freq[None, :]  # (N, hs/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (N, hs)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def tables(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[position_ids], self.sin[position_ids]  # (B, T, hs) each

    def forward(self, q, k, position_ids):
        """q (B, nh, T, hs), k (B, nkv, T, hs) -> both rotated by their positions."""
        cos, sin = (t[:, None] for t in self.tables(position_ids))  # (B, 1, T, hs)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# ---- the model ----------------------------------------------------------------------------------


class DecoderBlock(nn.Module):
    """Pre-norm block: x = x + Attn(norm(x)); x = x + FFN(norm(x))."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.ln_attn = norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.norm_bias)
        self.attn = MultiHeadAttention(
            cfg.d_model,
            cfg.n_heads,
            bias=cfg.qkv_bias,
            n_kv_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim,
            out_bias=cfg.out_bias,
            qk_norm_eps=cfg.layer_norm_eps if cfg.qk_norm else None,
        )
        self.ln_ffn = norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.norm_bias)
        self.ffn = FeedForward(
            cfg.d_model,
            cfg.d_ff,
            bias=cfg.mlp_bias,
            dropout=cfg.dropout,
            activation=cfg.activation,
            gated=cfg.gated_mlp,
        )
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask, past=None, rotate=None, position_ids=None):
        y, present = self.attn(self.ln_attn(x), mask, past=past, rotate=rotate, position_ids=position_ids)
        x = x + self.dropout(y)
        return x + self.ffn(self.ln_ffn(x)), present


class GPTDecoder(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        if cfg.norm not in NORMS or cfg.positions not in POSITIONS:
            raise ValueError(f"norm {cfg.norm!r} / positions {cfg.positions!r}: supported {NORMS} / {POSITIONS}")
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model) if cfg.positions == "learned" else None
        self.rotary = Rotary(cfg) if cfg.positions == "rotary" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = norm(cfg.norm, cfg.d_model, cfg.layer_norm_eps, cfg.norm_bias)
        self.lm_head = None if cfg.tied_head else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def embed(self, input_ids, position_ids):
        """(B, T) ids and positions -> (B, T, C): token embeddings, plus learned positions."""
        x = self.wte(input_ids) if self.wpe is None else self.wte(input_ids) + self.wpe(position_ids)
        return self.drop(x)

    def logits(self, x):
        """(B, T, C) -> (B, T, V): through the tied embedding, or the untied head."""
        return x @ self.wte.weight.T if self.lm_head is None else self.lm_head(x)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past: Past | None = None):
        """input_ids (B, T); attention_mask (B, P+T); position_ids (B, T); past: n_layers x (k, v)
        each (B, nkv, P, hs). Returns logits (B, T, V) and present: n_layers x (B, nkv, P+T, hs)."""
        B, T = input_ids.shape
        P = past[0][0].shape[2] if past else 0
        if attention_mask is None:
            attention_mask = torch.ones(B, P + T, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(P, P + T, device=input_ids.device)[None, :].expand(B, T)
        x = self.embed(input_ids, position_ids)  # (B, T, C)
        mask = causal_mask(attention_mask, T, x.dtype)  # (B, 1, T, P+T)
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, mask, past[i] if past else None, self.rotary, position_ids)
            present.append(kv)
        return self.logits(self.ln_f(x)), present

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, stop_at_eos: bool = True) -> torch.Tensor:
        """Greedy reference, (1, T) -> (1, T+n): one token a step over this module's own cache (`forward`'s
        past); once the sequence would pass max_positions, the whole last window re-run every step."""
        ids, past = input_ids, None
        for _ in range(max_new_tokens):
            if ids.shape[1] > self.config.max_positions:  # a sliding window: no cache holds it
                logits, _ = self(ids[:, -self.config.max_positions :])
            elif past is None:
                logits, past = self(ids)
            else:
                logits, past = self(ids[:, -1:], past=past)
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
            ids = torch.cat([ids, nxt], dim=1)
            if stop_at_eos and int(nxt) == self.config.eos_token_id:
                break
        return ids

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
