"""Sparse-embedding model directories: export a `SpladeEncoder` (export/models/mlm.py), gate it.

Graph role `encoder`: `input_ids`, `attention_mask` (batch, sequence) int64 -> `sparse_embedding`
(batch, vocab) float32, the pooled vocabulary weights (log(1 + ReLU(logits)) max-pooled over the real
tokens): the (B, T, V) logits stay inside the graph; the service keeps each row's non-zero entries.
Right-padded batches, token type 0 (single texts). No packed graph: pooling a packed row's
segments would need a scatter over V per input (the padded graph is what the service runs).
The gate (`sparse_parity`) compares ONNX weights with PyTorch's on mixed-length batches and each
input alone: fp32 and optimized within `parity.LOGITS_MAX_ABS`; fp16 and int8 are judged on the
cosine of the vectors (`QUALITY_LIMITS`), which says whether `variant=auto` may serve them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from export.gate import parity
from export.models.mlm import SpladeEncoder
from export.onnx import graphs as ox
from export.onnx.fill_mask import FillMaskGraph
from service.manifest import TensorSpec

OUTPUT = "sparse_embedding"
QUALITY_LIMITS = {"cos_min": 0.99, "batch_max_abs_diff": 1e-3}


class SparseGraph(nn.Module):
    """(input_ids, attention_mask) -> (B, V): the fill-mask graph's logits (its fusable mask), pooled."""

    def __init__(self, model: SpladeEncoder):
        super().__init__()
        self.model, self.logits = model, FillMaskGraph(model.mlm)

    def forward(self, input_ids, attention_mask):
        return self.model.pool(self.logits(input_ids, attention_mask), attention_mask)  # (B, V)


def sparse_specs(model: SpladeEncoder) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [TensorSpec(n, "int64", ["batch", "sequence"]) for n in ("input_ids", "attention_mask")]
    return inputs, [TensorSpec(OUTPUT, "float32", ["batch", model.config.vocab_size])]


def export_sparse(model: SpladeEncoder, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs, outputs = sparse_specs(model)
    ids = ox._example_ids(model.config.vocab_size, ox._B, ox._T)
    ox._export(SparseGraph(model), (ids, torch.ones_like(ids)), path, inputs, outputs)
    return inputs, outputs


def sparse_parity(
    model: SpladeEncoder, graph: Path, batches: Sequence[Sequence[Sequence[int]]], pad_id: int, variant: str = "fp32"
) -> dict:
    """ONNX weights vs PyTorch's on right-padded batches, and each input alone vs in its batch."""
    sess = parity.session(graph)
    diff, batch_diff, cos, inputs = 0.0, 0.0, [], 0
    for batch in batches:
        ids, mask = parity.pad_batch(batch, pad_id, left=False)
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()  # (B, V)
        got = sess.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float32)
        alone = np.concatenate([sess.run([OUTPUT], _single(seq))[0] for seq in batch]).astype(np.float32)
        diff = max(diff, float(np.abs(ref - got).max()))
        batch_diff = max(batch_diff, float(np.abs(alone - got).max()))
        cos.append(parity._cos(ref, got))
        inputs += len(batch)
    figures: dict[str, Any] = {
        "values_max_abs_diff": diff,
        "batch_max_abs_diff": batch_diff,
        "cos_min": float(np.concatenate(cos).min()),
        "inputs": inputs,
    }
    if parity.VARIANT_LIMITS[variant][2]:
        if diff > parity.LOGITS_MAX_ABS:
            what = f"{variant} sparse weights max abs diff vs PyTorch ({inputs} inputs)"
            parity._fail(what, diff, parity.LOGITS_MAX_ABS)
    else:
        figures["quality_ok"] = figures["cos_min"] >= QUALITY_LIMITS["cos_min"] and (
            batch_diff <= QUALITY_LIMITS["batch_max_abs_diff"]
        )
        figures["quality_limits"] = QUALITY_LIMITS
    return figures


def _single(seq: Sequence[int]) -> dict[str, np.ndarray]:
    ids = np.asarray([seq], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
