"""A decoder embedder's graphs (export/models/decoder_embedder.py): the embedding kind's two roles.

`encoder` (padded): (input_ids, attention_mask) -> sentence_embedding (B, C), the last real token's
state, not normalised; rows may be padded on either side (positions and the pooled token come from
the mask). `packed`: (input_ids, position_ids, segment_ids) -> token_embeddings (rows, length, C),
the packed layout of export/onnx/packed.py with a causal block-diagonal mask: a token sees the
earlier tokens of its own input only, which is exactly what it sees alone, so a causal decoder
packs like an encoder; the service takes each input's last token (service/engine/packing.py
`pool`, mode "last"). Both are gated against `DecoderEmbedder.forward` by the embedding kind's gate.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from export.models.decoder_embedder import DecoderEmbedder
from export.onnx import graphs as ox
from service.engine.packing import pack
from service.manifest import TensorSpec


class PaddedGraph(nn.Module):
    def __init__(self, model: DecoderEmbedder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids, attention_mask)  # (B, C)


def causal_segment_mask(segment_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(R, L) segment ids -> additive (R, 1, L, L): 0 where the key is of the query's input and not after it."""
    L = segment_ids.shape[1]
    slots = torch.arange(L, device=segment_ids.device)
    earlier = slots[None, :] <= slots[:, None]  # (L, L): key slot <= query slot
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)  # (R, L, L)
    return (1.0 - (same & earlier)[:, None].to(dtype)) * torch.finfo(dtype).min  # (R, 1, L, L)


class PackedGraph(nn.Module):
    def __init__(self, model: DecoderEmbedder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, segment_ids):
        mask = causal_segment_mask(segment_ids, torch.float32)
        return self.model.token_states(input_ids, position_ids, mask)  # (R, L, C)


def export(model: DecoderEmbedder, paths: dict[str, Path]) -> None:
    """Both roles' fp32 graphs, traced on examples of distinct lengths (no axis frozen)."""
    cfg = model.config
    inputs = [TensorSpec(n, "int64", ["batch", "sequence"]) for n in ("input_ids", "attention_mask")]
    outputs = [TensorSpec("sentence_embedding", "float32", ["batch", cfg.d_model])]
    ids = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # one row left-padded
    ox._export(PaddedGraph(model), (ids, mask), paths["encoder"], inputs, outputs)
    example = pack([list(range(3, 8)), list(range(3, 6)), list(range(3, 10))], 9, cfg.pad_token_id)
    args = tuple(torch.from_numpy(a) for a in (example.input_ids, example.position_ids, example.segment_ids))
    inputs = [TensorSpec(n, "int64", ["rows", "length"]) for n in ("input_ids", "position_ids", "segment_ids")]
    outputs = [TensorSpec("token_embeddings", "float32", ["rows", "length", cfg.d_model])]  # as packed.specs
    ox._export(PackedGraph(model), args, paths["packed"], inputs, outputs)
