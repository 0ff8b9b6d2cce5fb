"""Classification model directories (kind "classification": rerankers and sequence classifiers).

`build_classification` exports a `SequenceClassifier` (export/classifier.py) as the padded graph
(role `encoder`: input_ids, attention_mask[, token_type_ids] -> logits (batch, labels)) and the
packed graph (role `packed`: several inputs per row, packed as the service packs them, in rows of
64 tokens and of the longest input), gates both on single texts and on text pairs (a query with
documents, one pair long enough to be truncated), builds the requested variants and writes the
manifest: `extra.labels` (id2label in id order) and `extra.activation` (sigmoid | softmax | none)
tell the service how to read the logits. tokenizer.json never pads and truncates pairs at
max_input_tokens, longest first, as transformers' `truncation=True` does. fp32 and optimized must
match PyTorch's logits within `parity.LOGITS_MAX_ABS`; fp16 and int8 are judged on their scores
(`SCORE_LIMITS`) and must be batch-invariant; `quality_ok` says whether `variant=auto` may serve them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from export import onnx_export as ox
from export import packed, parity
from export.attention import attention_graph
from export.build import GATE_TEXTS, _build, _derive_variants, _exact
from export.classifier import SequenceClassifier, export_classifier, export_packed_classifier
from export.modeldir import GraphFile
from export.packed import GATE_ROW_TOKENS
from service.engine.packing import alignment, pack
from service.manifest import ModelDir

SCORE_LIMITS = {"score_max_abs_diff": 0.01, "batch_max_abs_diff": parity.LOGITS_MAX_ABS}


def gate_inputs(tokenizer: Tokenizer) -> list[list[tuple[list[int], list[int]]]]:
    """Batches of (ids, type ids): single texts, and pairs of one query with every gate text."""
    singles = [(e.ids, e.type_ids) for e in tokenizer.encode_batch(GATE_TEXTS)]
    pairs = [(e.ids, e.type_ids) for e in tokenizer.encode_batch([(GATE_TEXTS[1], t) for t in GATE_TEXTS])]
    return [singles, pairs, pairs[2:5], [pairs[6]]]  # mixed lengths; pairs[6] truncated at the limit


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


def _runs(model: SequenceClassifier, graph: Path, role: str, pad_id: int, variant: str) -> list[Callable]:
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
    model: SequenceClassifier, graph: Path, batches, pad_id: int, variant: str = "fp32", role: str = "encoder"
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
    figures = {
        "logits_max_abs_diff": diff,
        "score_max_abs_diff": score_diff,
        "batch_max_abs_diff": batch_diff,
        "inputs": rows,
    }
    if _exact(variant):
        if diff > parity.LOGITS_MAX_ABS:
            what = f"{variant} {role} classifier logits max abs diff vs PyTorch ({rows} inputs)"
            parity._fail(what, diff, parity.LOGITS_MAX_ABS)
    else:
        figures["quality_ok"] = all(figures[k] <= limit for k, limit in SCORE_LIMITS.items())
        figures["quality_limits"] = SCORE_LIMITS
    return figures


def _both(model: SequenceClassifier, paths: dict[str, Path], batches, pad_id: int, variant: str = "fp32") -> dict:
    """The padded graph's figures, with the packed graph's under "packed" (quality_ok: both hold)."""
    figures = classifier_parity(model, paths["encoder"], batches, pad_id, variant)
    figures["packed"] = classifier_parity(model, paths["packed"], batches, pad_id, variant, "packed")
    if "quality_ok" in figures:
        figures["quality_ok"] = figures["quality_ok"] and figures["packed"]["quality_ok"]
    return figures


def build_classification(
    model: SequenceClassifier,
    tokenizer: Tokenizer,
    out: Path,
    *,
    name: str,
    special_tokens: dict,
    variants=(),
    extra: dict | None = None,
) -> ModelDir:
    """fp32 graphs (padded, packed) -> gate -> variants -> attention graph -> tokenizer.json -> model.json."""
    cfg, head = model.config, model.head_config
    tokenizer.no_padding()
    tokenizer.enable_truncation(cfg.max_length)
    batches = gate_inputs(tokenizer)

    def measure(variant: str, paths: dict[str, Path]) -> dict:
        return _both(model, paths, batches, cfg.pad_token_id, variant)

    def body(staging: Path) -> dict:
        started = time.perf_counter()
        fp32 = {"encoder": staging / "encoder.onnx", "packed": staging / packed.FILE}
        export_classifier(model, fp32["encoder"])
        export_packed_classifier(model, fp32["packed"])
        figures = _both(model, fp32, batches, cfg.pad_token_id)
        figures["export_seconds"] = round(time.perf_counter() - started, 2)
        graphs = [GraphFile(role, "fp32", p, *ox.graph_io(p), figures) for role, p in fp32.items()]
        optimize = dict.fromkeys(fp32, ("bert", cfg.n_heads, cfg.d_model))
        graphs += _derive_variants(variants, fp32, staging, optimize, False, measure)
        # the encoder's attention maps (InspectionService): single texts, token type 0, as the RPC reads them
        attention_graphs, attention = attention_graph(model.encoder, staging, [[i for i, _ in b] for b in batches])
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(
            graphs=graphs,
            name=name,
            kind="classification",
            architecture={"type": "bert-classifier", **asdict(cfg)},
            special_tokens=special_tokens,
            max_input_tokens=cfg.max_length,
            parity={
                **figures,
                "attention_max_abs_diff": attention["attention_max_abs_diff"],
                "attention_ok": attention["ok"],
                "thresholds": {
                    "logits_max_abs": parity.LOGITS_MAX_ABS,
                    **SCORE_LIMITS,
                    "attention_max_abs": attention["limit"],
                },
            },
            extra={**(extra or {}), "labels": head.labels, "activation": head.activation},
        )

    return _build(out, body)
