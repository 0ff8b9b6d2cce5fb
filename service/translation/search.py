"""Greedy and beam search for one source at a time, advanced one decoder step at a time.

Every source is a `SourceSearch` owning k consecutive rows of the decoder batch (k = 1: greedy)
with its own max_length and length_penalty, so sources with different options share a batch and
join or leave it between steps. `advance_batch` takes one step's logits for every row: argmax for
greedy rows, one log-softmax for all beam rows, then each source's bookkeeping. Beam search is
fairseq-style, scored sum(log p) * exp(-length_penalty * log(len)), a form that cannot overflow
(docs/design/translation.md; the bound on length_penalty: docs/api.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MAX_LENGTH_PENALTY = 10.0  # 256 ** -10 ~ 1e-24: scores stay distinct in a float32 reply


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # generated tokens, EOS included when it ended the hypothesis
    score: float  # length-normalised log-probability


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(R, V) -> (R, V), in the logits' float type (scores are accumulated in float64)."""
    x = logits - logits.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def greedy_pick(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, V) -> argmax tokens (R,) and their log-probabilities (R,), without a full log-softmax."""
    tokens = logits.argmax(axis=-1)
    top = logits[np.arange(logits.shape[0]), tokens]
    return tokens, -np.log(np.exp(logits - top[:, None]).sum(axis=-1))


def normalised(logprob: float, length: int, length_penalty: float) -> float:
    """logprob / length^length_penalty in log space: the divisor never overflows (length_penalty >= 0)."""
    return float(logprob) * math.exp(-length_penalty * math.log(max(length, 1)))


@dataclass(eq=False)
class SourceSearch:
    """One source's search state; its k rows sit contiguously in the decoder batch."""

    k: int
    bos: int
    eos: int
    max_length: int
    length_penalty: float
    greedy: bool = True  # k = 1 by argmax (False runs the beam algorithm at k = 1, for tests)
    steps: int = 0  # tokens generated so far = the position its rows feed next
    result: Hypothesis | None = None
    last: np.ndarray = field(init=False)  # (k,) tokens its rows feed next
    beams: list[list[int]] = field(init=False)
    scores: np.ndarray = field(init=False)  # (k,) summed log-probabilities, float64
    final: list[Hypothesis] = field(default_factory=list)

    def __post_init__(self):
        self.greedy = self.greedy and self.k == 1
        self.last = np.full(self.k, self.bos, np.int64)
        self.beams = [[] for _ in range(self.k)]
        self.scores = np.r_[0.0, np.full(self.k - 1, -np.inf)]  # only beam 0 starts

    def pick(self, token: int, logp: float) -> np.ndarray | None:
        """Greedy step: appends the argmax; returns the rows to keep (local), None when done."""
        self.beams[0].append(token)
        self.scores[0] += logp
        self.steps += 1
        if token == self.eos or self.steps >= self.max_length:
            self.result = Hypothesis(self.beams[0], normalised(self.scores[0], self.steps, self.length_penalty))
            return None
        self.last = np.array([token], np.int64)
        return np.zeros(1, np.int64)

    def expand(self, logp: np.ndarray) -> np.ndarray | None:
        """Beam step over its rows' log-probabilities (k, V); returns each live beam's parent row
        (local, (k,)), None when done."""
        picked = self._top(logp)
        self.steps += 1
        if len(self.final) >= self.k or self.steps >= self.max_length:
            for beam, score in zip(self.beams, self.scores):
                if len(self.final) < self.k and np.isfinite(score):
                    self.final.append(Hypothesis(beam, normalised(score, len(beam), self.length_penalty)))
            self.result = max(self.final, key=lambda h: h.score)
            return None
        self.last = np.asarray([tok for _, tok in picked], np.int64)
        return np.asarray([beam for beam, _ in picked], np.int64)

    def _top(self, logp: np.ndarray) -> list[tuple[int, int]]:
        """Updates beams/scores/final; returns (parent beam, token) per live beam."""
        k, vocab = self.k, logp.shape[-1]
        cand = (self.scores[:, None] + logp.astype(np.float64)).ravel()  # (k * V,)
        top = np.argpartition(-cand, 2 * k)[: 2 * k] if cand.size > 2 * k else np.arange(cand.size)
        top = top[np.argsort(-cand[top], kind="stable")]
        picked, new_beams, new_scores = [], [], []
        for rank, c in enumerate(top):
            if not np.isfinite(cand[c]):
                break
            beam, tok = divmod(int(c), vocab)
            if tok == self.eos:
                if rank < k and len(self.final) < k:
                    seq = self.beams[beam] + [tok]
                    self.final.append(Hypothesis(seq, normalised(float(cand[c]), len(seq), self.length_penalty)))
                continue
            picked.append((beam, tok))
            new_beams.append(self.beams[beam] + [tok])
            new_scores.append(cand[c])
            if len(picked) == k:
                break
        while len(picked) < k:  # vocabulary smaller than 2k: pad with dead beams
            picked.append((0, self.eos))
            new_beams.append([])
            new_scores.append(-np.inf)
        self.beams, self.scores = new_beams, np.asarray(new_scores)
        return picked


def advance_batch(sources: list[SourceSearch], logits: np.ndarray) -> tuple[np.ndarray, list, list]:
    """One step for every source over the batch's logits (R, V), rows in source order.

    Returns the rows to keep (global, in the new batch order), the sources still running, and
    (source, exception or None) for each source that finished or failed: an exception in one
    source's bookkeeping fails that source only, its neighbours go on."""
    sizes = np.array([s.k for s in sources])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    greedy = np.array([s.greedy for s in sources], bool)
    g_rows = starts[greedy]
    no_rows = np.zeros(0, np.int64)
    g_tok, g_logp = greedy_pick(logits[g_rows]) if g_rows.size else (no_rows, np.zeros(0))  # (G,) each
    b_rows = np.concatenate([np.arange(st, st + n) for st, n, g in zip(starts, sizes, greedy) if not g] or [no_rows])
    b_logp = log_softmax(logits[b_rows.astype(np.int64)]) if b_rows.size else logits[:0]  # (B', V)
    keep: list[np.ndarray] = []
    running: list[SourceSearch] = []
    ended: list[tuple[SourceSearch, BaseException | None]] = []
    gi = bi = 0
    for src, start in zip(sources, starts):
        try:
            parents = src.pick(int(g_tok[gi]), float(g_logp[gi])) if src.greedy else src.expand(b_logp[bi : bi + src.k])
        except Exception as exc:
            ended.append((src, exc))
            parents = None
        else:
            if parents is None:
                ended.append((src, None))
        if src.greedy:
            gi += 1
        else:
            bi += src.k
        if parents is not None:
            keep.append(start + parents)
            running.append(src)
    return (np.concatenate(keep) if keep else np.zeros(0, np.int64)), running, ended
