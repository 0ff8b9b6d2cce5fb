"""Batched greedy and beam search over an encoder-decoder graph pair (numpy + onnxruntime).

`Seq2SeqState` holds the rows being decoded: the decoder's self-attention KV cache (grown one
position per step), the cross-attention K/V the encoder produced once per source (reused at every
step; on CUDA uploaded to the device once per batch composition) and the source mask. Rows leave
(finished sources) or are re-ordered (beam search) with `select`.

Search (fairseq-style): every source keeps `k` live hypotheses; each step scores all k x V
extensions, takes the best 2k, finalises end-of-sequence candidates ranked within the top k and
keeps the best k others alive. A source is done once k hypotheses are final or `max_length`
tokens were generated (then its live beams are final too). The answer is the final hypothesis
with the best length-normalised score, sum(log p) / len^length_penalty (len counts EOS).
With k = 1 this is exactly greedy search, which `greedy_search` implements on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.textgen.kvcache import GraphIO, KVBatch, run_step, to_device


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
    return float(logprob) / (max(length, 1) ** length_penalty)


class Seq2SeqState:
    def __init__(self, session, io: GraphIO, cross: list[np.ndarray], src_mask: np.ndarray, device: str | None):
        self.session, self.io, self.device = session, io, device
        self.cross_names = tuple(n.replace("past_key_values", "cross_key_values") for n in io.past_names)
        self.cache = KVBatch.empty(io, src_mask.shape[0], device)
        self._cross = dict(zip(self.cross_names, cross))  # each (R, H, S, D)
        self._src_mask = src_mask  # (R, S)
        self._bound: dict | None = None

    def step(self, tokens: np.ndarray, position: int) -> np.ndarray:
        """tokens (R,) at one shared position -> next-token logits (R, V)."""
        if self._bound is None:
            self._bound = to_device({**self._cross, "encoder_attention_mask": self._src_mask}, self.device)
        feeds = {"input_ids": tokens[:, None].astype(np.int64),  # (R, 1)
                 "position_ids": np.full((tokens.shape[0], 1), position, np.int64)}  # (R, 1)
        return run_step(self.session, self.io, feeds, self.cache, self._bound)

    def select(self, rows: np.ndarray) -> None:
        """Keeps (and re-orders, repeats) rows: cache, cross K/V and source mask alike."""
        self.cache.keep(list(rows))
        self._cross = {k: v[rows] for k, v in self._cross.items()}  # (R', H, S, D)
        self._src_mask = self._src_mask[rows]
        self._bound = None


def greedy_search(state: Seq2SeqState, bos: int, eos: int, max_lengths: list[int], length_penalty: float) -> list[Hypothesis]:
    """One row per source; argmax at every step; rows leave as their source finishes."""
    n = len(max_lengths)
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprob = np.zeros(n)
    active = np.arange(n)  # source of each row
    last = np.full(n, bos, np.int64)
    step = 0
    while active.size:
        nxt, logp = greedy_pick(state.step(last, step))  # (R,), (R,)
        keep = []
        for r, src in enumerate(active):
            tokens[src].append(int(nxt[r]))
            logprob[src] += logp[r]
            if nxt[r] != eos and len(tokens[src]) < max_lengths[src]:
                keep.append(r)
        step += 1
        if len(keep) < active.size and keep:
            state.select(np.asarray(keep))
        active, last = active[keep], nxt[keep]
    return [Hypothesis(t, normalised(float(lp), len(t), length_penalty)) for t, lp in zip(tokens, logprob)]


def beam_search(state: Seq2SeqState, k: int, bos: int, eos: int, max_lengths: list[int],
                length_penalty: float) -> list[Hypothesis]:
    """k rows per source (the state holds each source's rows k times, contiguously)."""
    n = len(max_lengths)
    final: list[list[Hypothesis]] = [[] for _ in range(n)]
    beams: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
    scores = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], (n, 1))  # (n, k): only beam 0 starts
    active = list(range(n))
    last = np.full(n * k, bos, np.int64)
    step = 0
    while active:
        logp = log_softmax(state.step(last, step)).reshape(len(active), k, -1)  # (A, k, V)
        step += 1
        rows, still, tokens_next = [], [], []
        for a, src in enumerate(active):
            picked = _expand(src, beams, scores, final, logp[a], k, eos, length_penalty)
            if len(final[src]) >= k or step >= max_lengths[src]:
                for beam, score in zip(beams[src], scores[src]):
                    if len(final[src]) < k and np.isfinite(score):
                        final[src].append(Hypothesis(beam, normalised(score, len(beam), length_penalty)))
                continue
            still.append(src)
            rows.extend(a * k + beam for beam, _ in picked)
            tokens_next.extend(tok for _, tok in picked)
        if still:
            state.select(np.asarray(rows))
        active, last = still, np.asarray(tokens_next, np.int64)
    return [max(f, key=lambda h: h.score) for f in final]


def _expand(src: int, beams, scores, final, logp: np.ndarray, k: int, eos: int, lp: float) -> list[tuple[int, int]]:
    """One source's step: updates its beams/scores/final in place; returns (parent beam, token) per live beam."""
    vocab = logp.shape[-1]
    cand = (scores[src][:, None] + logp.astype(np.float64)).ravel()  # (k * V,)
    top = np.argpartition(-cand, 2 * k)[: 2 * k] if cand.size > 2 * k else np.arange(cand.size)
    top = top[np.argsort(-cand[top], kind="stable")]
    picked, new_beams, new_scores = [], [], []
    for rank, c in enumerate(top):
        if not np.isfinite(cand[c]):
            break
        beam, tok = divmod(int(c), vocab)
        if tok == eos:
            if rank < k and len(final[src]) < k:
                seq = beams[src][beam] + [tok]
                final[src].append(Hypothesis(seq, normalised(float(cand[c]), len(seq), lp)))
            continue
        picked.append((beam, tok))
        new_beams.append(beams[src][beam] + [tok])
        new_scores.append(cand[c])
        if len(picked) == k:
            break
    while len(picked) < k:  # vocabulary smaller than 2k: pad with dead beams
        picked.append((0, eos))
        new_beams.append([])
        new_scores.append(-np.inf)
    beams[src], scores[src] = new_beams, np.asarray(new_scores)
    return picked
