"""The graphs of a classification model (export/models/classifier.py) and their gate.

The padded graph (role `encoder`: input_ids, attention_mask[, token_type_ids] -> logits (batch,
labels)) takes token_type_ids only when the tokenizer produces them (BERT pairs: 0 for the first
text, 1 for the second; RoBERTa and XLM-R use one type). The packed graph (role `packed`,
export/onnx/packed.py's rows: several inputs per row, attention kept within each) also takes
`first_index`, the flat position of each input's first token, and returns the logits of each input.
The gate (`classifier_parity`, `both`) runs batches of (ids, type ids) through a graph, padded or
packed as the service packs them, in rows of 64 tokens and of the longest input: fp32 and
optimized must match PyTorch's logits within `parity.LOGITS_MAX_ABS`; fp16 and int8 are judged on
their scores (`SCORE_LIMITS`) and must be batch-invariant; `quality_ok` says whether
`variant=auto` may serve them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from export.gate import parity
from export.models.families import Classifier
from export.onnx import graphs as ox
from export.onnx.packed import GATE_ROW_TOKENS
from service.engine.packing import alignment, pack
from service.manifest import TensorSpec

SCORE_LIMITS = {"score_max_abs_diff": 0.01, "batch_max_abs_diff": parity.LOGITS_MAX_ABS}


def feeds(batch, pad_id: int, token_types: bool) -> dict[str, np.ndarray]:
    ids, mask = parity.pad_batch([i for i, _ in batch], pad_id, left=False)
    out = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        out["token_type_ids"], _ = parity.pad_batch([t for _, t in batch], 0, left=False)
    return out


def packed_feeds(batch, pad_id: int, token_types: bool, row_tokens: int, align: int) -> dict[str, np.ndarray]:
    """The packed graph's inputs for a batch, packed as the service packs it (service/engine/packing.py)."""
    width = max(row_tokens, max(len(i) for i, _ in batch))
    p = pack([i for i, _ in batch], width, pad_id, align)
    out = {"input_ids": p.input_ids, "position_ids": p.position_ids, "segment_ids": p.segment_ids}
    out["first_index"] = p.row * p.input_ids.shape[1] + p.start  # (B,)
    if token_types:  # the same lengths pack to the same places
        out["token_type_ids"] = pack([t for _, t in batch], width, 0, align).input_ids
    return out


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """(B, L) logits -> scores, as the service applies them."""
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    if activation == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return logits


def _runs(model: Classifier, graph: Path, role: str, pad_id: int, variant: str) -> list[Callable]:
    """batch -> (B, L) logits through the graph: padded, or packed in rows of each GATE_ROW_TOKENS."""
    sess, types = parity.session(graph), model.head_config.token_types
    if role == "encoder":
        return [lambda batch: sess.run(["logits"], feeds(batch, pad_id, types))[0]]
    align = alignment(variant)
    return [
        lambda batch, rows=rows: sess.run(["logits"], packed_feeds(batch, pad_id, types, rows, align))[0]
        for rows in GATE_ROW_TOKENS
    ]


def classifier_parity(
    model: Classifier, graph: Path, batches, pad_id: int, variant: str = "fp32", role: str = "encoder"
) -> dict:
    """ONNX logits and scores vs PyTorch's on every gate batch; each row also alone (batch invariance)."""
    head = model.head_config
    diff, score_diff, batch_diff, rows = 0.0, 0.0, 0.0, 0
    for run in _runs(model, graph, role, pad_id, variant):
        for batch in batches:
            f = feeds(batch, pad_id, head.token_types)
            with torch.no_grad():
                ref = model(*(torch.from_numpy(f[k]) for k in f)).numpy()  # (B, L)
            got = run(batch).astype(np.float32)
            diff = max(diff, float(np.abs(ref - got).max()))
            scores = activate(ref, head.activation) - activate(got, head.activation)  # (B, L)
            score_diff = max(score_diff, float(np.abs(scores).max()))
            alone = np.concatenate([run([row]) for row in batch]).astype(np.float32)
            batch_diff = max(batch_diff, float(np.abs(alone - got).max()))
            rows += len(batch)
    figures: dict[str, Any] = {
        "logits_max_abs_diff": diff,
        "score_max_abs_diff": score_diff,
        "batch_max_abs_diff": batch_diff,
        "inputs": rows,
    }
    if parity.VARIANT_LIMITS[variant][2]:
        if diff > parity.LOGITS_MAX_ABS:
            what = f"{variant} {role} classifier logits max abs diff vs PyTorch ({rows} inputs)"
            parity._fail(what, diff, parity.LOGITS_MAX_ABS)
    else:
        figures["quality_ok"] = all(figures[k] <= limit for k, limit in SCORE_LIMITS.items())
        figures["quality_limits"] = SCORE_LIMITS
    return figures


def both(model: Classifier, paths: dict[str, Path], batches, pad_id: int, variant: str = "fp32") -> dict:
    """The padded graph's figures, with the packed graph's under "packed" (quality_ok: both hold)."""
    figures = classifier_parity(model, paths["encoder"], batches, pad_id, variant)
    figures["packed"] = classifier_parity(model, paths["packed"], batches, pad_id, variant, "packed")
    if "quality_ok" in figures:
        figures["quality_ok"] = figures["quality_ok"] and figures["packed"]["quality_ok"]
    return figures


class ClassifierGraph(nn.Module):
    """What the `encoder` graph computes: the classifier's forward through its encoder's
    `padded_hidden` (for BERT, the mask in the form onnxruntime's optimizer fuses, graphs.EncoderGraph)."""

    def __init__(self, model: Classifier):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        x = self.model.encoder.padded_hidden(input_ids, attention_mask, token_type_ids)  # (B, T, C)
        return self.model.classify(x, attention_mask)  # (B, L)


def classifier_specs(model: Classifier) -> tuple[list[TensorSpec], list[TensorSpec]]:
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if model.head_config.token_types else [])
    inputs = [TensorSpec(n, "int64", ["batch", "sequence"]) for n in names]
    return inputs, [TensorSpec("logits", "float32", ["batch", model.head_config.num_labels])]


def export_classifier(model: Classifier, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs, outputs = classifier_specs(model)
    ids = ox._example_ids(model.config.vocab_size, ox._B, ox._T)
    args = (ids, torch.ones_like(ids)) + ((torch.zeros_like(ids),) if model.head_config.token_types else ())
    ox._export(ClassifierGraph(model), args, path, inputs, outputs)
    return inputs, outputs


class PackedClassifierGraph(nn.Module):
    """(input_ids, position_ids, segment_ids[, token_type_ids]) (R, L) and first_index (B,) -> logits (B, L)."""

    def __init__(self, model: Classifier):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, segment_ids, first_index, token_type_ids=None):
        x = self.model.encoder.packed_hidden(input_ids, position_ids, segment_ids, token_type_ids)  # (R, L, C)
        return self.model.classify_packed(x, segment_ids, first_index)  # (B, labels)


def packed_specs(model: Classifier) -> tuple[list[TensorSpec], list[TensorSpec]]:
    names = ["input_ids", "position_ids", "segment_ids"]
    inputs = [TensorSpec(n, "int64", ["rows", "length"]) for n in names]
    inputs.append(TensorSpec("first_index", "int64", ["batch"]))
    if model.head_config.token_types:
        inputs.append(TensorSpec("token_type_ids", "int64", ["rows", "length"]))
    return inputs, [TensorSpec("logits", "float32", ["batch", model.head_config.num_labels])]


def export_packed_classifier(model: Classifier, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Traced on two rows of distinct segments and lengths (no axis frozen to an example size)."""
    inputs, outputs = packed_specs(model)
    example = pack([list(range(3, 8)), list(range(3, 6)), list(range(3, 10))], 9, model.config.pad_token_id)
    args = [torch.from_numpy(a) for a in (example.input_ids, example.position_ids, example.segment_ids)]
    args.append(torch.from_numpy(example.row * example.input_ids.shape[1] + example.start))
    if model.head_config.token_types:
        args.append(torch.from_numpy((example.position_ids > 2).astype("int64")))  # (R, L): both types
    ox._export(PackedClassifierGraph(model), tuple(args), path, inputs, outputs)
    return inputs, outputs
