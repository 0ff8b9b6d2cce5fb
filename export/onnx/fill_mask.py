"""Fill-mask model directories: export a `MaskedLM` (export/models/mlm.py), gate it, write kind "fill-mask".

Graph role `encoder`: `input_ids`, `attention_mask` (batch, sequence) int64 -> `logits` (batch,
sequence, vocab) float32 at every position (the service reads the `[MASK]` rows); right-padded
batches, token type 0. The gate (`fill_mask_parity`) compares ONNX logits with PyTorch's at every
real position on mixed-length batches (fp32 and optimized: `parity.LOGITS_MAX_ABS`, top-1 equal);
fp16 and int8 are judged on quality like reduced-precision decoders (`parity.quality_figures`, on a
masked sample). The `attention` graph is the encoder's (export/onnx/attention.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from export.gate import parity
from export.models.families import MLM
from export.onnx import graphs as ox
from service.manifest import TensorSpec

MASK_TEXTS = [
    "The cat sat on the [MASK].",
    "Once upon a time, there was a little [MASK] who loved to [MASK].",
    "[MASK] is the capital of France.",
    "[MASK]",
]
MASK_EVERY = 7  # quality sample: every 7th real token masked


class FillMaskGraph(nn.Module):
    """(input_ids, attention_mask) -> logits (B, T, V): the encoder's `padded_hidden` (the form
    onnxruntime's optimizer fuses, export/onnx/graphs.py EncoderGraph), then the head."""

    def __init__(self, model: MLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        enc = self.model.encoder
        x = enc.padded_hidden(input_ids, attention_mask)  # (B, T, C)
        return self.model.head(x, enc.embeddings.word.weight)  # (B, T, V)


def fill_mask_specs(model: MLM) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [
        TensorSpec("input_ids", "int64", ["batch", "sequence"]),
        TensorSpec("attention_mask", "int64", ["batch", "sequence"]),
    ]
    return inputs, [TensorSpec("logits", "float32", ["batch", "sequence", model.config.vocab_size])]


def export_fill_mask(model: MLM, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs, outputs = fill_mask_specs(model)
    ids = ox._example_ids(model.config.vocab_size, ox._B, ox._T)
    ox._export(FillMaskGraph(model), (ids, torch.ones_like(ids)), path, inputs, outputs)
    return inputs, outputs


def _logits(model: MLM, sess, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (PyTorch logits, ONNX logits), both (B, T, V) float32."""
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    got = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float32)
    return ref, got


def fill_mask_parity(
    model: MLM, graph: Path, batches: Sequence[Sequence[Sequence[int]]], pad_id: int, variant: str = "fp32"
) -> dict:
    """ONNX vs PyTorch logits at every real position of right-padded batches (module doc)."""
    sess = parity.session(graph)
    diff, same, positions = 0.0, 0, 0
    for batch in batches:
        ids, mask = parity.pad_batch(batch, pad_id, left=False)
        ref, got = _logits(model, sess, ids, mask)
        real = mask.astype(bool)  # (B, T)
        diff = max(diff, float(np.abs(ref[real] - got[real]).max()))
        same += int((ref[real].argmax(-1) == got[real].argmax(-1)).sum())
        positions += int(real.sum())
    figures = {
        "logits_max_abs_diff": diff,
        "top1_agreement": same / positions,
        "positions": positions,
        "inputs": sum(len(batch) for batch in batches),
    }
    limit = parity.VARIANT_LIMITS[variant][1]
    if limit is not None and diff > limit:
        parity._fail(f"{variant} fill-mask logits max abs diff vs PyTorch ({positions} positions)", diff, limit)
    return figures


def masked_sample(tokenizer: Tokenizer, texts: Sequence[str], mask_id: int, limit: int) -> list[tuple]:
    """-> (input ids with every MASK_EVERY-th real token masked, masked positions, original ids) per text."""
    rows = []
    for enc in tokenizer.encode_batch(list(texts)):
        ids = np.asarray(enc.ids[:limit], np.int64)
        real = np.flatnonzero(np.asarray(enc.special_tokens_mask[:limit]) == 0)
        positions = real[MASK_EVERY // 2 :: MASK_EVERY]
        if len(positions):
            masked = ids.copy()
            masked[positions] = mask_id
            rows.append((masked, positions, ids[positions]))
    return rows


def fill_mask_quality(
    model: MLM, graph: Path, sample: list[tuple], description: str, pad_id: int, variant: str = "int8"
) -> dict:
    """Reduced-precision variant vs PyTorch at the sample's masked positions (parity.quality_figures)."""
    sess = parity.session(graph)
    rows, alone = [], []
    for ids, positions, targets in sample:
        ref, got = _logits(model, sess, ids[None, :], np.ones((1, len(ids)), np.int64))
        rows.append((ref[0, positions], got[0, positions], targets))
        alone.append(got[0])
    head = [ids for ids, _, _ in sample[: parity.BATCH_ROWS]]
    ids, mask = parity.pad_batch(head, pad_id, left=False)
    batched = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    batch_diff = max(float(np.abs(batched[i, : len(x)] - alone[i]).max()) for i, x in enumerate(head))
    return parity.quality_figures(rows, description, batch_diff, variant)
