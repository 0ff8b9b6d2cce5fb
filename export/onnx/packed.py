"""Packed encoder graphs (role `packed`): several inputs per row, attention confined to each input.

Rows come from `service.engine.packing.pack` (inputs side by side) with per-token `position_ids`
(each input from 0) and `segment_ids` (1, 2, ... per input, 0 for the tail); a block-diagonal mask
built from the segments keeps each token within its own input. Outputs per kind: embedding ->
`token_embeddings` (the service pools per input); fill-mask -> `logits` only at `gather_positions`;
the translator's encoder -> cross-attention K/V gathered per source by `unpack_index` into the padded
encoder's layout, so the decoder graph is unchanged. Gated like every graph (export/gate/parity.py);
design and figures: docs/design/packing.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from export.gate import parity
from export.models.families import MLM, Encoder
from export.models.layers import segment_mask
from export.models.seq2seq import Translator
from export.onnx import graphs as ox
from service.engine.packing import Packed, alignment, pack, pool
from service.manifest import TensorSpec
from service.translation import encoder as translation_encoder

FILE = "packed.onnx"
Model = Encoder | MLM | Translator  # the kinds with a packed encoder graph
GATE_ROW_TOKENS = (64, 0)  # rows of 64 tokens (several inputs each), and of the longest input (0)


class PackedEncoderGraph(nn.Module):
    def __init__(self, model: Encoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, segment_ids):
        return self.model.packed_hidden(input_ids, position_ids, segment_ids)  # (R, L, C)


class PackedMaskedLMGraph(nn.Module):
    def __init__(self, model: MLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, segment_ids, gather_positions):
        enc = self.model.encoder
        x = enc.packed_hidden(input_ids, position_ids, segment_ids)  # (R, L, C)
        picked = x.reshape(-1, x.shape[-1])[gather_positions]  # (M, C)
        return self.model.head(picked, enc.embeddings.word.weight)  # (M, V)


class PackedTranslatorEncoderGraph(nn.Module):
    """Packed sources -> cross K/V per decoder layer, each (B, nkv, S, hs) as the padded encoder's.

    unpack_index[b, s]: the flat (row * length + offset) index of source b's token s (for s past
    its length any token of its own: the decoder's encoder_attention_mask hides those slots)."""

    def __init__(self, model: Translator):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, segment_ids, unpack_index):
        m = self.model
        x = m._embed(input_ids, position_ids)  # (R, L, C)
        mask = segment_mask(segment_ids, x.dtype)  # (R, 1, L, L)
        for layer in m.encoder_layers:
            x = layer(x, mask)
        flat = m.encoder_norm(x).reshape(-1, x.shape[-1])  # (R*L, C): every packed token once
        out = []
        for layer in m.decoder_layers:
            attn = layer.cross_attn
            for proj in (attn.key, attn.value):  # projected packed, then gathered per source
                out.append(attn.split_heads(proj(flat)[unpack_index], attn.n_kv_heads))  # (B, nkv, S, hs)
        return tuple(out)


def specs(model: Model) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [TensorSpec(n, "int64", ["rows", "length"]) for n in ("input_ids", "position_ids", "segment_ids")]
    if isinstance(model, Translator):
        inputs.append(TensorSpec("unpack_index", "int64", ["batch", "source_sequence"]))
        return inputs, ox.translator_specs(model)["encoder"][1]
    if isinstance(model, MLM):
        inputs.append(TensorSpec("gather_positions", "int64", ["positions"]))
        return inputs, [TensorSpec("logits", "float32", ["positions", model.config.vocab_size])]
    return inputs, [TensorSpec("token_embeddings", "float32", ["rows", "length", model.config.d_model])]


def export_packed(model: Model, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Traced on two rows of distinct segments and lengths (no axis frozen to an example size)."""
    inputs, outputs = specs(model)
    example = pack([list(range(3, 8)), list(range(3, 6)), list(range(3, 10))], 9, model.config.pad_token_id)
    args = [torch.from_numpy(a) for a in (example.input_ids, example.position_ids, example.segment_ids)]
    if isinstance(model, MLM):
        args.append(torch.tensor([0, 4, 10], dtype=torch.int64))
        ox._export(PackedMaskedLMGraph(model), tuple(args), path, inputs, outputs)
    elif isinstance(model, Translator):
        args.append(torch.from_numpy(translation_encoder.unpack(example)[0]))
        ox._export(PackedTranslatorEncoderGraph(model), tuple(args), path, inputs, outputs)
    else:
        ox._export(PackedEncoderGraph(model), tuple(args), path, inputs, outputs)
    return inputs, outputs


def _feeds(packed: Packed) -> dict[str, np.ndarray]:
    return {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "segment_ids": packed.segment_ids}


# ---- embedding ----------------------------------------------------------------------------------


def embed(
    sess, seqs: Sequence[Sequence[int]], pad_id: int, pooling: str, row_tokens: int, align: int = 1
) -> np.ndarray:
    """(N, C) pooled embeddings of seqs through a packed graph, packed as the service packs them."""
    packed = pack(seqs, max(row_tokens, max(len(s) for s in seqs)), pad_id, align)
    (hidden,) = sess.run(["token_embeddings"], _feeds(packed))
    return pool(hidden, packed, pooling)


def embedding_parity(
    model: Encoder,
    graph: Path,
    batches,
    pad_id: int,
    variant: str = "fp32",
    reference: parity.EmbeddingReference | None = None,
) -> dict:
    """Packed embeddings vs PyTorch (cosine per input) and alone vs among others (module doc)."""
    sess, pooling = parity.session(graph), model.config.pooling
    reference = reference or parity.EmbeddingReference(model, pad_id)
    cos, alone_diff, n = [], 0.0, 0
    for batch in batches:
        ref = reference(batch)
        for row_tokens in GATE_ROW_TOKENS:
            got = embed(sess, batch, pad_id, pooling, row_tokens, alignment(variant))
            cos.append(parity._cos(ref, got))
            alone = np.concatenate([embed(sess, [s], pad_id, pooling, row_tokens, alignment(variant)) for s in batch])
            alone_diff = max(alone_diff, float(np.abs(alone - got).max()))
        n += len(batch)
    cos_min = float(np.concatenate(cos).min())
    figures = {"cos_min": cos_min, "alone_max_abs_diff": alone_diff, "inputs": n, "row_tokens": list(GATE_ROW_TOKENS)}
    if cos_min < parity.VARIANT_LIMITS[variant][0]:
        parity._fail(
            f"{variant} packed encoder cosine vs PyTorch (min over {n} inputs)",
            cos_min,
            parity.VARIANT_LIMITS[variant][0],
        )
    if parity.VARIANT_LIMITS[variant][2] and alone_diff > parity.LOGITS_MAX_ABS:
        parity._fail(
            f"{variant} packed encoder: an input alone vs packed with others (max abs diff)",
            alone_diff,
            parity.LOGITS_MAX_ABS,
        )
    return figures


def embedding_quality(
    model: Encoder,
    graph: Path,
    sample,
    sample_name: str,
    pad_id: int,
    variant: str,
    chunk: int = 32,
    reference: parity.EmbeddingReference | None = None,
) -> dict:
    """A reduced-precision packed graph on the quality sample, as parity.encoder_quality judges padded ones."""
    sess, pooling, align = parity.session(graph), model.config.pooling, alignment(variant)
    reference = reference or parity.EmbeddingReference(model, pad_id)
    ref = np.concatenate([reference(sample[i : i + chunk]) for i in range(0, len(sample), chunk)])
    got = np.concatenate(
        [
            embed(sess, sample[i : i + chunk], pad_id, pooling, GATE_ROW_TOKENS[0], align)
            for i in range(0, len(sample), chunk)
        ]
    )
    alone = np.concatenate([embed(sess, [s], pad_id, pooling, GATE_ROW_TOKENS[0], align) for s in sample[:chunk]])
    limit = parity.batch_limit(variant, float(np.abs(got).max()))
    cos, limits = parity._cos(ref, got), {**parity.EMBEDDING_QUALITY_LIMITS, "batch_max_abs_diff": limit}
    diff = float(np.abs(alone - got[: len(alone)]).max())
    figures: dict[str, Any] = {
        "sample": sample_name,
        "texts": len(sample),
        "cos_min": round(float(cos.min()), 5),
        "cos_mean": round(float(cos.mean()), 5),
        "similarity_spearman": round(
            parity._spearman(parity._pair_similarities(ref), parity._pair_similarities(got)), 5
        ),
        "batch_max_abs_diff": float(f"{diff:.3g}"),
        "limits": limits,
    }
    ok = (
        figures["cos_min"] >= limits["cos_min"]
        and figures["cos_mean"] >= limits["cos_mean"]
        and figures["similarity_spearman"] >= limits["similarity_spearman_min"]
        and diff <= limits["batch_max_abs_diff"]
    )
    return {"quality": figures, "quality_ok": ok}


# ---- fill-mask ----------------------------------------------------------------------------------


def mask_logits(
    sess,
    seqs: Sequence[Sequence[int]],
    positions: Sequence[Sequence[int]],
    pad_id: int,
    row_tokens: int,
    align: int = 1,
) -> list[np.ndarray]:
    """Logits (len(positions[i]), V) at the given token positions of each input, through a packed graph."""
    packed = pack(seqs, max(row_tokens, max(len(s) for s in seqs)), pad_id, align)
    inputs = np.repeat(np.arange(len(seqs)), [len(p) for p in positions])
    offsets = np.concatenate([np.asarray(p, np.int64) for p in positions])
    (logits,) = sess.run(["logits"], {**_feeds(packed), "gather_positions": packed.flat_positions(offsets, inputs)})
    return np.split(np.asarray(logits, np.float32), np.cumsum([len(p) for p in positions])[:-1])


def fill_mask_parity(model: MLM, graph: Path, batches, pad_id: int, variant: str = "fp32") -> dict:
    """Packed logits at every real position vs PyTorch's padded forward, and alone vs among others."""
    sess = parity.session(graph)
    diff, alone_diff, same, total = 0.0, 0.0, 0, 0
    for batch in batches:
        ids, mask = parity.pad_batch(batch, pad_id, left=False)
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()  # (B, T, V)
        everywhere = [range(len(s)) for s in batch]
        align = alignment(variant)
        for row_tokens in GATE_ROW_TOKENS:
            got = mask_logits(sess, batch, everywhere, pad_id, row_tokens, align)
            alone = [mask_logits(sess, [s], [range(len(s))], pad_id, row_tokens, align)[0] for s in batch]
            for i, g in enumerate(got):
                r = ref[i, : len(batch[i])]
                diff = max(diff, float(np.abs(r - g).max()))
                alone_diff = max(alone_diff, float(np.abs(alone[i] - g).max()))
                same += int((r.argmax(-1) == g.argmax(-1)).sum())
                total += len(g)
    figures: dict[str, Any] = {
        "logits_max_abs_diff": diff,
        "top1_agreement": same / total,
        "alone_max_abs_diff": alone_diff,
        "positions": total,
        "row_tokens": list(GATE_ROW_TOKENS),
    }
    limit = parity.VARIANT_LIMITS[variant][1]
    if limit is not None and diff > limit:
        parity._fail(f"{variant} packed fill-mask logits max abs diff vs PyTorch ({total} positions)", diff, limit)
    if parity.VARIANT_LIMITS[variant][2] and alone_diff > parity.LOGITS_MAX_ABS:
        parity._fail(
            f"{variant} packed fill-mask: an input alone vs packed with others (max abs diff)",
            alone_diff,
            parity.LOGITS_MAX_ABS,
        )
    return figures


def fill_mask_quality(
    model: MLM, graph: Path, sample: list[tuple], description: str, pad_id: int, variant: str
) -> dict:
    """A reduced-precision packed graph at the sample's masked positions (parity.quality_figures)."""
    sess, align = parity.session(graph), alignment(variant)
    seqs = [ids.tolist() for ids, _, _ in sample]
    got = mask_logits(sess, seqs, [p for _, p, _ in sample], pad_id, GATE_ROW_TOKENS[0], align)
    rows = []
    for (ids, positions, targets), g in zip(sample, got):
        with torch.no_grad():
            ref = model(torch.from_numpy(ids[None, :]), torch.ones((1, len(ids)), dtype=torch.int64))[0].numpy()
        rows.append((ref[positions], g, targets))
    head = seqs[: parity.BATCH_ROWS]
    alone = [mask_logits(sess, [s], [p], pad_id, GATE_ROW_TOKENS[0], align)[0] for s, (_, p, _) in zip(head, sample)]
    diff = max(float(np.abs(a - g).max()) for a, g in zip(alone, got))
    return parity.quality_figures(rows, description, diff, variant)


# ---- translation (the translator's encoder) ------------------------------------------------------


def translator_cross(
    sess, seqs: Sequence[Sequence[int]], pad_id: int, row_tokens: int, align: int = 1
) -> tuple[list[np.ndarray], np.ndarray]:
    """Cross K/V per decoder layer (flat: key, value, ...; each (B, nkv, S, hs)) and the source mask
    (B, S) of seqs through a packed translator encoder graph, packed as the service packs them."""
    feeds, mask, _ = translation_encoder.packed_feeds(seqs, row_tokens, pad_id, align)
    return sess.run(None, feeds), mask


def translator_parity(
    model: Translator,
    graph: Path,
    decoder_graph: Path,
    sources: Sequence[Sequence[int]],
    variant: str = "fp32",
    reference: list[list[int]] | None = None,
) -> dict:
    """Packed cross K/V vs PyTorch's padded `encode` (every real source position), each source
    packed alone vs among others, and greedy tokens through the decoder graph vs the reference."""
    cfg = model.config
    src, src_mask = parity.pad_batch(sources, cfg.pad_token_id, left=False)
    with torch.no_grad():
        ref = [t.numpy() for kv in model.encode(torch.from_numpy(src), torch.from_numpy(src_mask)) for t in kv]
    sess, align = parity.session(graph), translation_encoder.alignment(variant)
    valid = src_mask.astype(bool)[:, None, :, None]  # (B, 1, S, 1)
    diff, alone_diff, peak = 0.0, 0.0, 0.0
    for row_tokens in GATE_ROW_TOKENS:
        cross, mask = translator_cross(sess, sources, cfg.pad_token_id, row_tokens, align)
        peak = max(peak, *(float(np.abs(c.astype(np.float32)).max()) for c in cross))
        if not np.array_equal(mask, src_mask):
            parity._fail(f"{variant} packed translator encoder: source mask differs from the padded one", 1.0, 0.0)
        diff = max(
            diff,
            *(
                float(np.abs(np.where(valid, r - c.astype(np.float32), 0)).max())
                for r, c in zip(ref, cross, strict=True)
            ),
        )
        for i, s in enumerate(sources):
            alone, _ = translator_cross(sess, [s], cfg.pad_token_id, row_tokens, align)
            alone_diff = max(
                alone_diff,
                *(
                    float(np.abs(a[0, :, : len(s)].astype(np.float32) - c[i, :, : len(s)].astype(np.float32)).max())
                    for a, c in zip(alone, cross, strict=True)
                ),
            )
    figures: dict[str, Any] = {
        "cross_kv_max_abs_diff": diff,
        "alone_max_abs_diff": alone_diff,
        "cross_kv_peak": peak,
        "inputs": len(sources),
        "row_tokens": list(GATE_ROW_TOKENS),
    }
    limit, exact = parity.VARIANT_LIMITS[variant][1], parity.VARIANT_LIMITS[variant][2]
    if limit is not None and diff > limit:
        parity._fail(f"{variant} packed translator encoder cross K/V max abs diff vs PyTorch", diff, limit)
    if exact and alone_diff > parity.LOGITS_MAX_ABS:
        parity._fail(
            f"{variant} packed translator encoder: a source alone vs packed with others (max abs diff)",
            alone_diff,
            parity.LOGITS_MAX_ABS,
        )
    reference = reference or parity.reference_translations(model, sources)
    cross, mask = translator_cross(sess, sources, cfg.pad_token_id, GATE_ROW_TOKENS[0], align)
    step = parity.onnx_step(parity.session(decoder_graph), parity.cross_feeds(cross, mask), cfg.max_positions)
    start = np.full((len(sources), 1), cfg.decoder_start_token_id, np.int64)
    tokens = parity.greedy_loop(step, start, np.ones_like(start), np.zeros_like(start), len(reference[0]))
    figures.update(parity.compare_tokens(reference, tokens, exact, f"{variant} packed translator greedy"))
    return figures


def translator_quality(
    model: Translator,
    graph: Path,
    decoder_graph: Path,
    pairs,
    sample: str,
    variant: str,
    alone_max_abs_diff: float,
    cross_kv_peak: float,
    reference: parity.ForcedReference | None = None,
) -> dict:
    """A reduced-precision packed encoder with its decoder graph, teacher-forced on the sample as
    parity.translator_quality judges the padded ones; `quality_ok` also needs each source's cross
    K/V independent of its neighbours (alone_max_abs_diff from translator_parity)."""
    sess, align = parity.session(graph), translation_encoder.alignment(variant)
    pad = model.config.pad_token_id
    figures = parity.translator_quality(
        model,
        graph,
        decoder_graph,
        pairs,
        sample,
        encode=lambda rows: translator_cross(sess, rows, pad, GATE_ROW_TOKENS[0], align),
        variant=variant,
        reference=reference,
    )
    alone_ok = alone_max_abs_diff <= parity.batch_limit(variant, cross_kv_peak)
    figures["quality_ok"] = figures["quality_ok"] and alone_ok
    return figures
