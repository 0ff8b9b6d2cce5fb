"""Transformer building blocks shared by the encoder, decoder and encoder-decoder.

Follows "Attention Is All You Need" (Vaswani et al., 2017) bottom-up: masks, scaled dot-product
attention probabilities, multi-head attention (self and cross, with an optional KV cache, able to
record its probabilities), the position-wise feed-forward network, and learned / sinusoidal
positional encodings.

Masks are additive float tensors broadcastable to (B, nh, T, S): 0 where attention is allowed,
the dtype's most negative value where it is not (finite, so a fully masked row never yields NaN).
Every tensor a function here builds lives on its input's device, so the models run on CUDA as on
the CPU (tests/export/test_export_device.py runs them on the "meta" device to prove it).
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn


def padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, S) 1/0 key mask -> additive (B, 1, 1, S)."""
    allowed = attention_mask[:, None, None, :].to(torch.bool)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def same_segment(segment_ids: torch.Tensor) -> torch.Tensor:
    """(R, L) segment ids of packed rows (export/onnx/packed.py) -> bool (R, 1, L, L): both tokens of
    the same input (segment 0, a row's padded tail, sees nothing)."""
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)  # (R, L, L)
    return same[:, None]


def segment_mask(segment_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(R, L) segment ids -> additive (R, 1, L, L): 0 where both tokens belong to the same input."""
    return (1.0 - same_segment(segment_ids).to(dtype)) * torch.finfo(dtype).min  # (R, 1, L, L)


def pool_tokens(tokens: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Token states (B, T, C) -> (B, C): "mean" over the attention mask, "cls" (the first token), or
    "max" over the real tokens (sentence-transformers' Pooling modes; padding never wins a max)."""
    if mode == "cls":
        return tokens[:, 0]  # (B, C)
    weights = attention_mask.to(tokens.dtype)[:, :, None]  # (B, T, 1)
    if mode == "max":
        return tokens.masked_fill(weights == 0, torch.finfo(tokens.dtype).min).max(dim=1).values  # (B, C)
    summed = (tokens * weights).sum(dim=1)  # (B, C)
    return summed / weights.sum(dim=1).clamp(min=1e-9)


def causal_mask(attention_mask: torch.Tensor, query_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Causal + padding mask for T new queries appended after P cached keys.

    attention_mask: (B, P+T) 1/0 over all key slots (past then new). Query t sits at key slot P+t
    and may see slots j <= P+t that the attention mask allows. Returns additive (B, 1, T, P+T).
    """
    total = attention_mask.shape[1]
    past = total - query_len
    q_pos = torch.arange(query_len, device=attention_mask.device)[:, None] + past  # (T, 1)
    k_pos = torch.arange(total, device=attention_mask.device)[None, :]  # (1, P+T)
    allowed = (k_pos <= q_pos)[None, None, :, :] & attention_mask[:, None, None, :].to(torch.bool)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def attention_probs(q, k, mask):
    """softmax(q k^T / sqrt(d) + mask): (B, nh, T, S), each row sums to 1 over the allowed keys."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, T, S)
    return torch.softmax(scores + mask, dim=-1)


# Activation names as config.json spells them (hidden_act / activation_function) -> the function.
ACTIVATIONS = {
    "gelu": F.gelu,  # erf form (BERT, Marian's "gelu")
    "gelu_new": partial(F.gelu, approximate="tanh"),  # GPT-2's tanh form
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_fast": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich, 2019) as Llama computes it: in fp32, then weight."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        # One cast, reused: two casts of an fp32 tensor trace as a Cast chain that onnxruntime
        # 1.32's basic optimizations remove wrongly (a dangling input; the session fails to load).
        h = x.float()
        variance = h.pow(2).mean(-1, keepdim=True)  # (B, T, 1)
        return self.weight * (h * torch.rsqrt(variance + self.eps)).to(x.dtype)


def norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """ "layernorm" (with or without bias) or "rmsnorm"."""
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps)
    return nn.LayerNorm(d_model, eps=eps, bias=bias)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate q/k/v projections (the layout BERT checkpoints use).

    n_kv_heads < n_heads: grouped-query attention (Ainslie et al., 2023), each key/value head
    shared by n_heads / n_kv_heads query heads; the cache holds n_kv_heads. head_dim defaults to
    d_model / n_heads. qk_norm_eps: None, or an RMSNorm over each head's query and key (weights
    of head_dim) before positions are applied (Qwen3). `rotate`: None, or a callable
    (q, k, position_ids) -> (q, k) applied to the new positions before they meet the cache (rotary
    positions, export/models/decoder.py).
    `record`: None, or a list to which every forward appends its attention probabilities
    (B, nh, T, S); the attention graphs (export/onnx/attention.py) output them. The ops are the same
    either way, so the other graphs do not change.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        bias: bool = True,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        out_bias: bool | None = None,
        qk_norm_eps: float | None = None,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads or n_heads
        self.head_dim = head_dim or d_model // n_heads
        if n_heads % self.n_kv_heads or (head_dim is None and d_model % n_heads):
            raise ValueError(f"{n_heads} heads do not split d_model {d_model} / {self.n_kv_heads} KV heads evenly")
        inner, kv_inner = n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.query = nn.Linear(d_model, inner, bias=bias)
        self.key = nn.Linear(d_model, kv_inner, bias=bias)
        self.value = nn.Linear(d_model, kv_inner, bias=bias)
        self.out = nn.Linear(inner, d_model, bias=bias if out_bias is None else out_bias)
        self.q_norm = RMSNorm(self.head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(self.head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.record: list[torch.Tensor] | None = None

    def split_heads(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, heads or self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a memory (B, S, C) -> two (B, nkv, S, hs); cross-attention computes them once."""
        return (
            self.split_heads(self.key(memory), self.n_kv_heads),
            self.split_heads(self.value(memory), self.n_kv_heads),
        )

    def forward(self, x, mask, past=None, memory_kv=None, rotate=None, position_ids=None):
        """x (B, T, C). past: cached (k, v) of earlier positions, each (B, nkv, P, hs).

        memory_kv: precomputed cross-attention (k, v); when given, keys/values come from it.
        Returns (y (B, T, C), present (k, v)) where present has P+T positions for self-attention.
        """
        B, T, _ = x.shape
        q = self.split_heads(self.query(x))  # (B, nh, T, hs)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if memory_kv is not None:
            k, v = memory_kv  # (B, nkv, S, hs)
        else:
            k, v = self.project_kv(x)  # (B, nkv, T, hs)
            if self.k_norm is not None:
                k = self.k_norm(k)
            if rotate is not None:
                q, k = rotate(q, k, position_ids)
            if past is not None:
                k = torch.cat([past[0], k], dim=2)  # (B, nkv, P+T, hs)
                v = torch.cat([past[1], v], dim=2)
        group = self.n_heads // self.n_kv_heads
        keys, values = (k, v) if group == 1 else (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
        probs = attention_probs(q, keys, mask)  # (B, nh, T, S)
        if self.record is not None:
            self.record.append(probs)
        y = (probs @ values).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, nh*hs)
        return self.out(y), (k, v)


class FeedForward(nn.Module):
    """Position-wise feed-forward: Linear -> activation -> Linear; gated (SwiGLU, Shazeer 2020):
    act(gate(x)) * fc_in(x) -> fc_out. `activation` is a config.json name (`ACTIVATIONS`)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        bias: bool = True,
        dropout: float = 0.0,
        activation: str = "gelu",
        gated: bool = False,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        self.act = ACTIVATIONS[activation]
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        h = self.act(self.fc_in(x)) if self.gate is None else self.act(self.gate(x)) * self.fc_in(x)
        return self.dropout(self.fc_out(h))


def sinusoidal_table(n_positions: int, d_model: int) -> torch.Tensor:
    """The fixed sin/cos positional encoding table of Vaswani et al., (n_positions, d_model)."""
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table


def sines_then_cosines(n_positions: int, d_model: int) -> torch.Tensor:
    """transformers' MarianSinusoidalPositionalEmbedding, (n_positions, d_model): the frequencies of
    `sinusoidal_table`, sines in the first half of the dims and cosines in the second, not
    interleaved; computed in float64 as transformers does (numpy), then cast."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (n, 1)
    pairs = torch.div(torch.arange(d_model), 2, rounding_mode="floor").double()  # (d,): 0, 0, 1, 1, ...
    angle = position / torch.pow(10000.0, 2 * pairs / d_model)  # (n, d)
    return torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], dim=1).float()


POSITION_LAYOUTS = {"interleaved": sinusoidal_table, "marian": sines_then_cosines}


class SinusoidalPositions(nn.Module):
    """Looks positions up in a fixed (non-trained) sinusoidal table, of one of `POSITION_LAYOUTS`."""

    table: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, n_positions: int, d_model: int, layout: str = "interleaved"):
        super().__init__()
        self.register_buffer("table", POSITION_LAYOUTS[layout](n_positions, d_model), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]  # (B, T, C)
