"""The next token of every row of a decode step at once: `choose_tokens(logits (B, V), rows)`.

Row i's token is exactly what one row sampled alone would give (the per-row reference in
tests/service/generation/test_sampler.py; they are compared on random mixes), with the array work
done per batch, not per row (vLLM's sampler: one pass over the (B, V) logits):
- repetition penalty: one fancy-indexed update over every penalised row's seen tokens;
- greedy rows: one argmax over their subset;
- sampled rows, grouped by top-k (argpartition's order of ties depends on k, so a group shares
  it): one temperature division, argpartition / stable argsort, exp, normalisation and top-p
  cut-off over the group;
- per row only what exactness needs: the sum over a row's own top-p prefix (numpy's pairwise
  summation rounds by length), its one draw from its own generator (a seeded request gives the
  same tokens in any batch) and the search of that draw in its cumulative distribution.
A row whose own work raises gets its exception back in place of a token; the others are unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.generation import penalties
from service.generation.decoding import SamplingParams


@dataclass
class Row:
    """What sampling needs of one row: its settings, the token ids it has seen, its generator."""

    params: SamplingParams
    seen: np.ndarray  # int64 ids the repetition penalty applies to (prompt + generated)
    rng: np.random.Generator | None  # None for a greedy row
    constraint: Any = None  # structured output: constraint.RowConstraint (its mask applies to this row alone)
    counts: dict[int, int] = field(default_factory=dict)  # generated tokens' counts (presence/frequency penalties)


def choose_tokens(logits: np.ndarray, rows: list[Row]) -> list[int | Exception]:
    """logits (B, V), one Row each -> the next token of each row, or the exception its row raised."""
    scores = _masked(penalties.adjusted(_penalised(logits, rows), logits, rows), logits, rows)
    out: list[int | Exception] = [0] * len(rows)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    if greedy:
        picked = np.argmax(scores if len(greedy) == len(rows) else scores[greedy], axis=1)
        for i, token in zip(greedy, picked.tolist()):
            out[i] = token
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if not r.params.greedy:
            k = r.params.top_k if 0 < r.params.top_k < scores.shape[1] else 0
            groups.setdefault(k, []).append(i)
    for k, members in groups.items():
        for i, token in zip(members, _sample_group(scores[members], k, [rows[i] for i in members])):
            out[i] = token
    return out


def _masked(scores: np.ndarray, logits: np.ndarray, rows: list[Row]) -> np.ndarray:
    """Each constrained row's disallowed tokens at -inf, on a copy (logits stay raw for logprobs)."""
    hit = [i for i, r in enumerate(rows) if r.constraint is not None]
    if not hit:
        return scores
    scores = scores.copy() if scores is logits else scores
    for i in hit:
        scores[i, ~rows[i].constraint.allowed()[: scores.shape[1]]] = -np.inf
    return scores


def _penalised(logits: np.ndarray, rows: list[Row]) -> np.ndarray:
    """HF repetition penalty on each penalised row's seen tokens (logit / p if > 0 else logit * p)."""
    hit = [i for i, r in enumerate(rows) if r.params.repetition_penalty not in (0.0, 1.0) and r.seen.size]
    if not hit:
        return logits
    seen = [rows[i].seen for i in hit]
    r = np.repeat(np.asarray(hit), [s.size for s in seen])  # (N,) row of each seen token
    c = np.concatenate(seen)  # (N,) its token id; repeats write the same value
    penalty = np.asarray([rows[i].params.repetition_penalty for i in hit], logits.dtype)
    penalty = np.repeat(penalty, [s.size for s in seen])
    scores = logits.copy()
    vals = scores[r, c]
    scores[r, c] = np.where(vals > 0, vals / penalty, vals * penalty)
    return scores


def _sample_group(scores: np.ndarray, top_k: int, rows: list[Row]) -> list[int | Exception]:
    """Rows sharing top_k (0: off): scores (n, V) -> one drawn token per row."""
    temperature = np.asarray([r.params.temperature for r in rows], np.float64)
    s = penalties.min_p_cut(scores.astype(np.float64) / temperature[:, None], rows)  # (n, V)
    if top_k:
        part = np.argpartition(-s, top_k - 1, axis=1)[:, :top_k]  # (n, k), unordered
        rank = np.argsort(-np.take_along_axis(s, part, axis=1), axis=1, kind="stable")
        order = np.take_along_axis(part, rank, axis=1)  # (n, k) token ids, most likely first
    else:
        order = np.argsort(-s, axis=1, kind="stable")  # (n, V)
    kept = np.take_along_axis(s, order, axis=1)
    probs = np.exp(kept - kept[:, :1])
    probs /= probs.sum(axis=1, keepdims=True)
    top_p = np.asarray([r.params.top_p for r in rows], np.float64)
    cut = (top_p > 0.0) & (top_p < 1.0)  # (n,) rows whose tail top-p removes
    kept_n = np.full(len(rows), probs.shape[1])  # (n,) tokens each row draws among
    if cut.any():
        before = np.cumsum(probs[cut], axis=1) - probs[cut]  # mass ranked above each token
        kept_n[cut] = np.maximum(1, np.count_nonzero(before < top_p[cut, None], axis=1))
    out: list[int | Exception] = []
    for i, r in enumerate(rows):
        try:
            out.append(_draw(probs[i], order[i], int(kept_n[i]), bool(cut[i]), r.rng))
        except Exception as exc:
            out.append(exc)
    return out


def _draw(probs: np.ndarray, order: np.ndarray, n: int, cut: bool, rng: np.random.Generator | None) -> int:
    """One row's draw among its first n ranked tokens, renormalised when top-p cut the tail."""
    assert rng is not None, "greedy rows take the argmax and never draw"
    if cut:
        probs = probs[:n] / probs[:n].sum()
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(order[min(i, n - 1)])
