"""The next token of every row of a decode step at once: `choose_tokens(logits (B, V), rows)`.

Row i's token is exactly what one row sampled alone would give (the per-row reference in
tests/service/generation/test_sampler.py; they are compared on random mixes), with the array work
done per batch, not per row (vLLM's sampler: one pass over the (B, V) logits):
- repetition penalty: one fancy-indexed update over every penalised row's seen tokens;
- greedy rows: one argmax over their subset;
- sampled rows, grouped by top-k: one temperature division over the group; with top-k, per row
  the tokens scoring at least the k-th best (`_top_candidates`, bounded by block maxima) ranked by a
  stable argsort, the first k kept (ties at the k-th score: the lower token ids); without, one exp
  over the group and no sort of the vocabulary: a row without top-p draws in token-id order, a
  top-p row ranks only the likeliest candidates its nucleus needs (`_nucleus`);
- per row only what exactness needs: its nucleus, the sum over its own top-p prefix (numpy's
  pairwise summation rounds by length), its one draw from its own generator (a seeded request gives the
  same tokens in any batch) and the search of that draw in its cumulative distribution (without
  top-k and top-p, by blocks: `_draw_unranked`).
A row whose own work raises gets its exception back in place of a token; the others are unaffected.
"""

from __future__ import annotations

import math
import threading
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
        for i, token in zip(members, _sample_group(_scaled(scores, members, rows), k, [rows[i] for i in members])):
            out[i] = token
    return out


class _Scratch(threading.local):
    """Per-thread float64 work arrays, reused across steps (grown when a step needs more): a fresh
    (n, V) temporary each step is mapped anew by the allocator and costs a page fault per 4 KiB
    (262 faults and ~0.5 ms for one row of a 50,257-token vocabulary, measured)."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def take(self, name: str, *shape: int) -> np.ndarray:
        size = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.size < size:
            buffer = self.buffers[name] = np.empty(size, np.float64)
        return buffer[:size].reshape(shape)


_SCRATCH = _Scratch()


def _scaled(scores: np.ndarray, members: list[int], rows: list[Row]) -> np.ndarray:
    """The members' scores (n, V) in float64 divided by their temperatures, min-p cut applied."""
    s = _SCRATCH.take("scaled", len(members), scores.shape[1])
    if len(members) == scores.shape[0]:
        np.copyto(s, scores)
    else:
        for j, i in enumerate(members):
            s[j] = scores[i]
    s /= np.asarray([rows[i].params.temperature for i in members], np.float64)[:, None]
    return penalties.min_p_cut(s, [rows[i] for i in members])


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


def _sample_group(s: np.ndarray, top_k: int, rows: list[Row]) -> list[int | Exception]:
    """Rows sharing top_k (0: off): their scaled scores (n, V) -> one drawn token per row."""
    top_p = np.asarray([r.params.top_p for r in rows], np.float64)
    cut = (top_p > 0.0) & (top_p < 1.0)  # (n,) rows whose tail top-p removes
    out: list[int | Exception] = []
    if top_k:
        for i, r in enumerate(rows):
            try:
                row = s[i]
                ids = _top_candidates(row, top_k)  # every token scoring at least the k-th best
                order = ids[np.argsort(-row[ids], kind="stable")][:top_k]  # ties: the lower ids first
                probs = np.exp(row[order] - row[order[0]])
                probs /= probs.sum()
                n = _nucleus_size(probs, top_p[i]) if cut[i] else probs.size
                out.append(_draw_ranked(probs, order, n, bool(cut[i]), r.rng))
            except Exception as exc:
                out.append(exc)
        return out
    # No top-k: the whole vocabulary, never sorted whole (a stable argsort of 50k float64 scores
    # costs 4 ms a row; 152k, 15 ms). Without top-p a row draws in token-id order; with it, only
    # the likeliest candidates are ranked, as many as its nucleus needs (_nucleus).
    e = np.subtract(s, s.max(axis=1, keepdims=True), out=_SCRATCH.take("work", *s.shape))
    holes = [i for i, r in enumerate(rows) if r.params.min_p > 0 or r.constraint is not None]
    if not holes:
        np.exp(e, out=e)  # (n, V) unnormalised probabilities
    else:
        for i in range(len(rows)):
            if i in holes:
                _exp_with_holes(e[i])
            else:
                np.exp(e[i], out=e[i])
    total = e.sum(axis=1) if cut.any() else None  # (n,): the top-p rows' normaliser
    for i, r in enumerate(rows):
        try:
            if cut[i]:
                assert total is not None
                probs, order, n = _nucleus(s[i], e[i], float(total[i]), float(top_p[i]))
                out.append(_draw_ranked(probs, order, n, True, r.rng))
            else:
                out.append(_draw_unranked(e[i], r.rng))
        except Exception as exc:
            out.append(exc)
    return out


def _exp_with_holes(row: np.ndarray) -> None:
    """exp in place of a row that min_p or a constraint left mostly at -inf: only its finite scores
    go through exp (numpy's exp takes a slow path on -inf: 266 against 60 us a row of 50,257), the
    rest become 0, as exp(-inf) is."""
    finite = np.flatnonzero(row > -np.inf)
    kept = np.exp(row[finite])
    row[...] = 0.0
    row[finite] = kept


# Tokens a block: a block's maximum bounds an m-th best score (_top_candidates), the blocks' sums
# find a draw's block (_draw_unranked).
BLOCK = 256


def _top_candidates(s: np.ndarray, m: int) -> np.ndarray:
    """One row's scores (V,) -> the ids of every token scoring at least its m-th best (ties
    included), ascending. Where m is at most the number of blocks of BLOCK tokens, the m-th
    largest block maximum bounds that score from below (m blocks hold a token at least that high),
    so one comparison over the row leaves a few candidates and only they are partitioned: ~50 us a
    row at 50,257 tokens, where partitioning the row costs 360 us (argpartition 660-920)."""
    vocab = s.size
    if m >= vocab:
        return np.arange(vocab)
    full = vocab - vocab % BLOCK
    blocks = full // BLOCK
    if m <= blocks:
        peaks = s[:full].reshape(blocks, BLOCK).max(axis=1)
        if full < vocab:
            peaks = np.append(peaks, s[full:].max())
        bound = np.partition(peaks, peaks.size - m)[peaks.size - m]  # <= the m-th best score
        candidates = np.flatnonzero(s >= bound)
    else:
        candidates = np.arange(vocab)
    if candidates.size >= m:
        scores = s[candidates]
        floor = np.partition(scores, scores.size - m)[scores.size - m]  # the m-th best score
        top = candidates[scores >= floor]
        if top.size >= m:
            return top
    # NaN scores (a broken graph's output) compare false with everything: the first m of the stable
    # ranking, NaN last, as ranking the whole row gives
    return np.sort(np.argsort(-s, kind="stable")[:m])


FIRST_CANDIDATES = 64  # tokens ranked first for a top-p row; x8 until its nucleus is inside


def _nucleus_size(probs: np.ndarray, top_p: float) -> int:
    """Ranked probabilities -> how many lead up to the first whose mass ranked above reaches top_p
    (at least 1); len(probs) when none in them does."""
    reached = (np.cumsum(probs) - probs) >= top_p  # mass ranked above each token
    return max(1, int(np.argmax(reached))) if reached.any() else probs.size


def _nucleus(s: np.ndarray, e: np.ndarray, total: float, top_p: float) -> tuple[np.ndarray, np.ndarray, int]:
    """One row's top-p nucleus without sorting the vocabulary: the tokens scoring at least the m-th
    best (ties included, so they are exactly the first ones of the stable descending order) ranked,
    m growing until the nucleus ends inside them. -> ranked probabilities, token ids, nucleus size;
    the same as ranking the whole vocabulary would give."""
    vocab, m = s.size, FIRST_CANDIDATES
    while True:
        if m >= vocab:
            order = np.argsort(-s, kind="stable")
        else:
            candidates = _top_candidates(s, m)  # ascending ids: ties stay in id order below
            order = candidates[np.argsort(-s[candidates], kind="stable")]
        probs = e[order] / total
        n = _nucleus_size(probs, top_p)
        if n < probs.size or order.size == vocab:
            return probs, order, n
        m *= 8


def _draw_ranked(probs: np.ndarray, order: np.ndarray, n: int, cut: bool, rng: np.random.Generator | None) -> int:
    """One row's draw among its first n ranked tokens, renormalised when top-p cut the tail."""
    assert rng is not None, "greedy rows take the argmax and never draw"
    probs = probs[:n] / probs[:n].sum() if cut else probs
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(order[min(i, n - 1)])


def _draw_unranked(e: np.ndarray, rng: np.random.Generator | None) -> int:
    """One row's draw over the whole vocabulary in token-id order (e: unnormalised probabilities):
    the draw's block from the running sum of the blocks' sums, then its token from the running sum
    within that block. The same distribution as one running sum over the vocabulary, whose
    sequential float64 adds cost 168 us a row at 50,257 tokens (the blocks' sums are pairwise, and
    this costs ~20 us): a token differs only where the draw falls within rounding (~1e-12 of the
    mass) of its edge. A token of zero probability is never drawn."""
    assert rng is not None, "greedy rows take the argmax and never draw"
    full = e.size - e.size % BLOCK
    sums = e[:full].reshape(-1, BLOCK).sum(axis=1)
    if full < e.size:
        sums = np.append(sums, e[full:].sum())
    cum = np.cumsum(sums)  # the mass up to each block's end
    target = rng.random() * cum[-1]
    b = min(int(np.searchsorted(cum, target, side="right")), cum.size - 1)  # a block of positive mass
    start = b * BLOCK
    block = e[start : start + BLOCK]
    i = int(np.searchsorted(np.cumsum(block), target - (cum[b - 1] if b else 0.0), side="right"))
    if i >= block.size:  # past the block's own running sum by rounding: its last token of positive mass
        positive = np.flatnonzero(block > 0)
        i = int(positive[-1]) if positive.size else block.size - 1
    return start + i
