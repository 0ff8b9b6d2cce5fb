"""GPT-style decoder-only language model with a KV cache.

References: Radford et al., "Language Models are Unsupervised Multitask Learners" (GPT-2, 2019)
for the pre-LN block, learned positions and tied input/output embeddings; Karpathy's nanoGPT
`model.py` for the layout. Unlike nanoGPT, `forward` takes an attention mask over past + new
positions and explicit position ids, so rows of different lengths can share one batch (the
service's continuous batching), and returns the present KV cache.

`generate` is the PyTorch reference without a cache: the ONNX KV-cache loop must reproduce its
greedy tokens exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from export.layers import FeedForward, MultiHeadAttention, causal_mask

Past = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class DecoderConfig:
    vocab_size: int = 8192
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    d_ff: int = 1024
    max_positions: int = 512
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    bos_token_id: int = 0
    eos_token_id: int = 0
    pad_token_id: int = 0


class DecoderBlock(nn.Module):
    """Pre-LN block: x = x + Attn(LN(x)); x = x + FFN(LN(x))."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, dropout=cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask, past=None):
        y, present = self.attn(self.ln_attn(x), mask, past=past)
        x = x + self.dropout(y)
        return x + self.ffn(self.ln_ffn(x)), present


class GPTDecoder(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.apply(_init_weights)

    def lm_head(self, x):
        return x @ self.wte.weight.T  # tied: (B, T, V)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past: Past | None = None):
        """input_ids (B, T); attention_mask (B, P+T); position_ids (B, T); past: n_layers x (k, v)
        each (B, nh, P, hs). Returns logits (B, T, V) and present: n_layers x (B, nh, P+T, hs)."""
        B, T = input_ids.shape
        P = past[0][0].shape[2] if past else 0
        if attention_mask is None:
            attention_mask = torch.ones(B, P + T, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(P, P + T, device=input_ids.device)[None, :].expand(B, T)
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))  # (B, T, C)
        mask = causal_mask(attention_mask, T, x.dtype)  # (B, 1, T, P+T)
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, mask, past[i] if past else None)
            present.append(kv)
        return self.lm_head(self.ln_f(x)), present

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, stop_at_eos: bool = True) -> torch.Tensor:
        """Greedy reference without a cache: re-runs the whole sequence every step. (1, T) -> (1, T+n)."""
        ids = input_ids
        for _ in range(max_new_tokens):
            window = ids[:, -self.config.max_positions :]
            logits, _ = self(window)
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
