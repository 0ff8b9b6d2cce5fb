"""A decoder-only model as a sentence embedder: the causal body, no LM head, last-token pooling.

References: Wang et al., "Improving Text Embeddings with Large Language Models" (E5-Mistral, 2024)
and the Qwen3-Embedding report (Zhang et al., 2025): the hidden state of the last token (the EOS
the tokenizer appends) after the final norm is the embedding, normalised afterwards;
sentence-transformers' Pooling `pooling_mode_lasttoken` computes the same. The body is
`GPTDecoder`'s blocks and final norm (export/models/decoder.py), so Llama, Mistral, Qwen2 and Qwen3
folders map onto it with the generation converter's weight names (export/convert/decoder_embedder.py).

Positions count each row's real tokens from 0 (`positions_from_mask`), and the pooled token is each
row's last real one (`last_token`), so a row's vector is the same padded on the left, on the
right, or not at all. `forward` returns the pooled vector *unnormalised*: the service normalises
(and may truncate dimensions first), as for the BERT-style `SentenceEncoder`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from export.models.decoder import DecoderConfig, GPTDecoder
from export.models.layers import causal_mask


@dataclass
class DecoderEmbedderConfig(DecoderConfig):
    pooling: str = "last"  # the manifest's pooling: the last real token of each input
    max_length: int = 512  # tokens the model is used with (sentence-transformers' max_seq_length)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1/0 -> (B, T) position ids: each real token's index among its row's real tokens
    (left padding shifts nothing); padded slots get 0."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0) * attention_mask


def last_token(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, C) -> (B, C): the state at each row's last real token, whichever side is padded."""
    T = attention_mask.shape[1]
    slots = torch.arange(T, device=attention_mask.device)[None, :] * attention_mask  # (B, T): index where real
    last = slots.argmax(-1)[:, None, None].expand(-1, 1, hidden.shape[-1])  # (B, 1, C)
    return hidden.gather(1, last).squeeze(1)  # (B, C)


class DecoderEmbedder(nn.Module):
    def __init__(self, cfg: DecoderEmbedderConfig):
        super().__init__()
        if not cfg.tied_head or cfg.positions != "rotary":
            raise ValueError("a decoder embedder has no LM head (tied_head=True) and rotary positions")
        self.config = cfg
        self.decoder = GPTDecoder(cfg)  # its wte, blocks and ln_f; the tied head is never used

    def token_states(self, input_ids, position_ids, mask):
        """input_ids, position_ids (B, T); mask additive (B, 1, T, T) -> final-normed states (B, T, C)."""
        m = self.decoder
        x = m.embed(input_ids, position_ids)  # (B, T, C)
        for block in m.blocks:
            x, _ = block(x, mask, None, m.rotary, position_ids)
        return m.ln_f(x)

    def forward(self, input_ids, attention_mask):
        """(B, T) ids and 1/0 mask, padded on either side -> (B, C) last-token states, not normalised."""
        positions = positions_from_mask(attention_mask)  # (B, T)
        mask = causal_mask(attention_mask, input_ids.shape[1], torch.float32)  # (B, 1, T, T)
        return last_token(self.token_states(input_ids, positions, mask), attention_mask)

    @torch.no_grad()
    def embed(self, input_ids, attention_mask) -> torch.Tensor:
        """Reference embeddings: pooled then L2-normalised, as sentence-transformers returns them."""
        return F.normalize(self(input_ids, attention_mask), p=2, dim=-1)
