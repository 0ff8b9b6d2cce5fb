"""Pictures of an AttentionResponse with matplotlib (client side only; the server never imports it).

- `grid_png`: one image, a row per (kind, layer) and a column per head, each a heatmap of
  queries (rows) x keys (columns) labelled with the tokens;
- `alignment_png`: a translator's cross-attention averaged over every decoder layer and head, target
  tokens x source tokens (the soft word alignment);
- `html_page`: one self-contained page (PNG images inline as data: URIs): a layer x head grid of
  panels per kind, the alignment for a translator, and a table of the head statistics.
"""

from __future__ import annotations

import base64
import html
import io

import numpy as np
from matplotlib.figure import Figure

from service.proto import inference_pb2 as pb

KIND_TITLES = {pb.SELF: "self-attention", pb.CAUSAL: "causal self-attention", pb.CROSS: "cross-attention"}
STATS = ("entropy", "mean_distance", "to_special", "to_previous", "to_self")
MAX_LABELS = 48  # beyond this many tokens an axis labels every k-th one


def label(token: str) -> str:
    """A token as shown on an axis: byte-level BPE's space and newline markers made readable."""
    return token.replace("Ġ", "_").replace("▁", "_").replace("Ċ", "\\n")


def axes_tokens(response: pb.AttentionResponse, m: pb.AttentionMap) -> tuple[list[str], list[str]]:
    """(query tokens, key tokens) of a map."""
    src, tgt = list(response.source_tokens), list(response.target_tokens)
    if m.kind == pb.CROSS:
        return tgt, src
    if m.kind == pb.CAUSAL and tgt:
        return tgt, tgt
    return src, src


def weights(m: pb.AttentionMap) -> np.ndarray:
    return np.asarray(m.weights, np.float32).reshape(m.rows, m.cols)


def _heatmap(ax, w: np.ndarray, queries: list[str], keys: list[str], title: str, fontsize: float) -> None:
    ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
    for tokens, setter, rotate in ((keys, ax.set_xticks, 90), (queries, ax.set_yticks, 0)):
        step = max(1, -(-len(tokens) // MAX_LABELS))
        ticks = list(range(0, len(tokens), step))
        setter(ticks, [label(tokens[i]) for i in ticks], fontsize=fontsize, rotation=rotate)
    ax.set_title(title, fontsize=fontsize + 2)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _rows(response: pb.AttentionResponse) -> list[tuple[int, int]]:
    """(kind, layer) pairs in response order."""
    return list(dict.fromkeys((m.kind, m.layer) for m in response.maps))


def grid_png(response: pb.AttentionResponse) -> bytes:
    """Every map of the response in one image: a row per (kind, layer), a column per head."""
    rows, heads = _rows(response), sorted({m.head for m in response.maps})
    tokens = max(len(response.source_tokens), len(response.target_tokens))
    cell = min(4.0, max(1.8, tokens * 0.14))
    fig = Figure(figsize=(cell * len(heads), cell * len(rows)))
    axes = fig.subplots(len(rows), len(heads), squeeze=False)
    for m in response.maps:
        ax = axes[rows.index((m.kind, m.layer))][heads.index(m.head)]
        title = f"{KIND_TITLES[m.kind]} L{m.layer} H{m.head}"
        _heatmap(ax, weights(m), *axes_tokens(response, m), title, fontsize=max(4.0, 9 - tokens / 12))
    fig.tight_layout()
    return _png(fig)


def panel_png(response: pb.AttentionResponse, m: pb.AttentionMap) -> bytes:
    tokens = max(m.rows, m.cols)
    size = min(6.0, max(2.6, tokens * 0.16))
    fig = Figure(figsize=(size, size))
    _heatmap(
        fig.subplots(),
        weights(m),
        *axes_tokens(response, m),
        f"L{m.layer} H{m.head}",
        fontsize=max(4.0, 9 - tokens / 12),
    )
    return _png(fig)


def alignment(response: pb.AttentionResponse) -> np.ndarray | None:
    """The mean of every cross-attention map, (target tokens, source tokens); None without any."""
    cross = [weights(m) for m in response.maps if m.kind == pb.CROSS]
    return np.mean(cross, axis=0) if cross else None


def alignment_png(response: pb.AttentionResponse) -> bytes:
    w = alignment(response)
    if w is None:
        raise ValueError("no cross-attention maps: an alignment needs a translator's response")
    size = min(10.0, max(3.0, 0.3 * max(w.shape)))
    fig = Figure(figsize=(size, size))
    _heatmap(
        fig.subplots(),
        w,
        list(response.target_tokens),
        list(response.source_tokens),
        "cross-attention, mean over layers and heads",
        fontsize=9,
    )
    return _png(fig)


def _img(data: bytes, alt: str, css: str) -> str:
    return f'<img class="{css}" alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def html_page(response: pb.AttentionResponse) -> str:
    """One self-contained HTML page (see the module doc)."""
    heads = sorted({m.head for m in response.maps})
    parts = [
        f"<h1>Attention of {html.escape(response.model)} ({html.escape(response.kind)})</h1>",
        f"<p>source: {html.escape(' '.join(label(t) for t in response.source_tokens))}</p>",
    ]
    if response.target_tokens:
        parts.append(f"<p>target: {html.escape(response.target)}</p>")
    if alignment(response) is not None:
        parts += ["<h2>Alignment</h2>", _img(alignment_png(response), "cross-attention alignment", "alignment")]
    for kind, title in KIND_TITLES.items():
        maps = [m for m in response.maps if m.kind == kind]
        if not maps:
            continue
        parts.append(f'<h2>{title}</h2><div class="grid" style="grid-template-columns: repeat({len(heads)}, 1fr)">')
        parts += [
            f'<figure class="panel" data-kind="{pb.AttentionKind.Name(kind)}" data-layer="{m.layer}" '
            f'data-head="{m.head}">{_img(panel_png(response, m), f"layer {m.layer} head {m.head}", "map")}'
            "</figure>"
            for m in maps
        ]
        parts.append("</div>")
    parts.append(stats_table(response))
    style = (
        "body{font-family:sans-serif;margin:1em} .grid{display:grid;gap:4px} figure{margin:0} "
        "img.map{width:100%} table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:2px 6px;"
        "text-align:right}"
    )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>Attention: {html.escape(response.model)}'
        f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def stats_table(response: pb.AttentionResponse) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("kind", "layer", "head", *STATS))
    rows = []
    for m in response.maps:
        values = "".join(f"<td>{getattr(m.stats, s):.3f}</td>" for s in STATS)
        rows.append(f"<tr><td>{pb.AttentionKind.Name(m.kind)}</td><td>{m.layer}</td><td>{m.head}</td>{values}</tr>")
    return f'<h2>Head statistics</h2><table class="stats"><tr>{head}</tr>{"".join(rows)}</table>'
