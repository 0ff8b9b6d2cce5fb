"""Attention graphs: every layer's attention probabilities, for inspection (role `attention`, fp32).

Each model kind gets one extra graph that runs the model's own modules with their attention
probabilities recorded (`MultiHeadAttention.record`, export/models/layers.py) and outputs them, one
(batch, heads, queries, keys) tensor per layer and attention kind (`self_attention.{i}`,
`causal_attention.{i}`, `cross_attention.{i}`; the translator's teacher-forced). The serving graphs
are untouched. The gate (`attention_parity`) compares every probability with PyTorch's on
right-padded batches, within what float32 rounding allows this model (export/gate/rounding.py); a
graph over that limit is left out of the directory with a warning instead
of failing the build, since inspection is optional and fp32 rounding margins differ between CPUs
(docs/attention.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn

from export.gate import parity, rounding
from export.modeldir import GraphFile
from export.models.decoder import GPTDecoder
from export.models.families import Encoder
from export.models.layers import MultiHeadAttention
from export.models.seq2seq import Translator
from export.onnx import graphs as ox
from export.onnx import store
from service.manifest import TensorSpec

log = logging.getLogger(__name__)

Model = Encoder | GPTDecoder | Translator  # the kinds with an attention graph
FILE = "attention.onnx"


def recorded(groups: Sequence[Sequence[MultiHeadAttention]], run: Callable[[], object]) -> list[torch.Tensor]:
    """Runs run() with every module of groups recording; -> their probabilities, group by group."""
    modules = [m for group in groups for m in group]
    records: list[list[torch.Tensor]] = [[] for _ in modules]
    for m, record in zip(modules, records):
        m.record = record
    try:
        run()
        return [record[0] for record in records]  # each module runs once per forward
    finally:
        for m in modules:
            m.record = None


class EncoderAttentionGraph(nn.Module):
    def __init__(self, model: Encoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        attn = [b.attn for b in self.model.blocks]
        return tuple(recorded([attn], lambda: self.model.token_embeddings(input_ids, attention_mask)))


class DecoderAttentionGraph(nn.Module):
    def __init__(self, model: GPTDecoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        attn = [b.attn for b in self.model.blocks]
        return tuple(recorded([attn], lambda: self.model(input_ids, attention_mask)))


class TranslatorAttentionGraph(nn.Module):
    def __init__(self, model: Translator):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask):
        m = self.model
        T = decoder_input_ids.shape[1]
        positions = torch.arange(T, device=decoder_input_ids.device)[None, :].expand_as(decoder_input_ids)  # (B, T)

        def run():
            cross = m.encode(input_ids, attention_mask)
            m.decode(decoder_input_ids, decoder_attention_mask, positions, None, cross, attention_mask)

        groups = [
            [layer.attn for layer in m.encoder_layers],
            [layer.self_attn for layer in m.decoder_layers],
            [layer.cross_attn for layer in m.decoder_layers],
        ]
        return tuple(recorded(groups, run))


def _maps(prefix: str, n: int, heads: int, queries: str, keys: str) -> list[TensorSpec]:
    return [TensorSpec(f"{prefix}.{i}", "float32", ["batch", heads, queries, keys]) for i in range(n)]


def attention_specs(model: Model) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The attention graph's inputs and outputs (module doc)."""
    ids = [
        TensorSpec("input_ids", "int64", ["batch", "sequence"]),
        TensorSpec("attention_mask", "int64", ["batch", "sequence"]),
    ]
    if isinstance(model, Encoder):
        return ids, _maps("self_attention", model.config.n_layers, model.config.n_heads, "sequence", "sequence")
    if isinstance(model, GPTDecoder):
        return ids, _maps("causal_attention", model.config.n_layers, model.config.n_heads, "sequence", "sequence")
    cfg = model.config
    src = [TensorSpec(t.name, t.dtype, ["batch", "source_sequence"]) for t in ids]
    tgt = [TensorSpec(f"decoder_{t.name}", t.dtype, t.shape) for t in ids]
    outputs = (
        _maps("self_attention", cfg.n_encoder_layers, cfg.n_heads, "source_sequence", "source_sequence")
        + _maps("causal_attention", cfg.n_decoder_layers, cfg.n_heads, "sequence", "sequence")
        + _maps("cross_attention", cfg.n_decoder_layers, cfg.n_heads, "sequence", "source_sequence")
    )
    return src + tgt, outputs


def _graph(model: Model) -> nn.Module:
    if isinstance(model, Encoder):
        return EncoderAttentionGraph(model)
    if isinstance(model, GPTDecoder):
        return DecoderAttentionGraph(model)
    return TranslatorAttentionGraph(model)


def _feeds(model: Model, rows: Sequence[Sequence[int]] | Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict:
    """Right-padded inputs: rows of ids, or (source ids, decoder input ids) pairs for a translator."""
    pad = model.config.pad_token_id
    if not isinstance(model, Translator):
        ids, mask = parity.pad_batch(cast(Sequence[Sequence[int]], rows), pad, left=False)
        return {"input_ids": ids, "attention_mask": mask}
    pairs = cast(Sequence[tuple[Sequence[int], Sequence[int]]], rows)
    src, src_mask = parity.pad_batch([s for s, _ in pairs], pad, left=False)
    tgt, tgt_mask = parity.pad_batch([t for _, t in pairs], pad, left=False)
    return {"input_ids": src, "attention_mask": src_mask, "decoder_input_ids": tgt, "decoder_attention_mask": tgt_mask}


def export_attention(model: Model, path: Path, example) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Exports the attention graph, traced on example rows (see `_feeds`) of distinct lengths."""
    inputs, outputs = attention_specs(model)
    feeds = _feeds(model, example)
    args = tuple(torch.from_numpy(feeds[t.name]) for t in inputs)
    exported = ox._export(_graph(model), args, path, inputs, outputs, check=False)
    ox._rewrite(exported, path, outputs, tied=False)  # the heads axis, which shape inference leaves unnamed
    return inputs, outputs


def _key_mask(output: str, feeds: dict) -> np.ndarray:
    """The (B, S) mask over an output's keys: the decoder's for its causal maps, else the source's."""
    if output.startswith("causal") and "decoder_attention_mask" in feeds:
        return feeds["decoder_attention_mask"]
    return feeds["attention_mask"]


def attention_parity(model: Model, path: Path, batches) -> dict:
    """ONNX vs PyTorch probabilities on right-padded batches -> figures (`ok`: within `limit`).

    The limit is what float32 rounding allows this model (export/gate/rounding.py): probabilities
    lie in [0, 1], but how far rounding moves them grows with the model's depth, widths and score
    magnitudes, and the order in which a CPU sums (AVX2, AVX-512/VNNI, AMX) decides where in that
    range a correct graph lands; a fixed 1e-5 held on one CPU and failed MiniLM on another."""
    sess, graph = parity.session(path), _graph(model).eval()
    names = [o.name for o in sess.get_outputs()]
    diff, moved, row_error, padded, maps = 0.0, 0.0, 0.0, 0.0, 0
    for batch in batches:
        feeds = _feeds(model, batch)
        got = sess.run(names, feeds)
        args = [torch.from_numpy(feeds[i.name]) for i in sess.get_inputs()]
        with torch.no_grad():
            ref = graph(*args)
            with rounding.rounding_noise(graph):
                noisy = graph(*args)
        moved = max([moved, *(float((n - r).abs().max()) for n, r in zip(noisy, ref))])
        for name, g, r in zip(names, got, ref):
            diff = max(diff, float(np.abs(g - r.numpy()).max()))
            row_error = max(row_error, float(np.abs(g.sum(-1) - 1).max()))
            key_mask = _key_mask(name, feeds)  # (B, S)
            padded = max(padded, float(np.where(key_mask[:, None, None, :] == 0, g, 0).max()))
            maps += g.shape[0] * g.shape[1]
    limit = rounding.float32_limit(moved)  # what float32 rounding allows this model on any CPU, not one CPU's figure
    return {
        "attention_max_abs_diff": diff,
        "row_sum_max_error": row_error,
        "padded_key_max_weight": padded,
        "maps": maps,
        "rounding_moved": moved,
        "limit": limit,
        "ok": diff <= limit,
    }


def attention_graph(model: Model, staging: Path, batches) -> tuple[list[GraphFile], dict]:
    """Export + gate: ([the `attention` graph (fp32)] or [] when over the limit, its figures). A
    model past 2 GiB of weights (a 1B decoder) has none: the graph would be another full copy
    of its weights, on disk and in the export's memory (the 1.1B conversion peaked at 23.5 GB with
    one), for an inspection door such models are rarely asked for."""
    path = staging / FILE
    weights = ox.weight_bytes(model)
    if weights >= store.PROTOBUF_LIMIT:
        log.info(
            "no attention graph: %.1f GB of weights (another copy of them); served without inspection", weights / 1e9
        )
        reason = f"{weights} bytes of weights, past 2 GiB: not built"
        return [], {"ok": False, "attention_max_abs_diff": None, "limit": None, "skipped": reason}
    export_attention(model, path, batches[0])
    figures = attention_parity(model, path, batches)
    if not figures["ok"]:
        log.warning(
            "attention graph left out: probabilities differ from PyTorch by %.3g (limit %g); the "
            "model is served without attention inspection",
            figures["attention_max_abs_diff"],
            figures["limit"],
        )
        for f in store.files(path):
            f.unlink()
        return [], figures
    return [GraphFile("attention", "fp32", path, *ox.graph_io(path), figures)], figures
