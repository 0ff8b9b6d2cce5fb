"""Log-probabilities of tokens: a prompt's, teacher-forced from its prefill's logits, and each
generated token's, for OpenAI's `logprobs` and `echo` (docs/design/scoring.md).

Values are raw: the log-softmax of the model's logits, before repetition penalty, temperature,
top-k and top-p (vLLM's default, `logprobs_mode="raw_logprobs"`), so a prompt's scores and its
continuation's are on one scale and a greedy token is its position's most likely one. A token and
its position's top-n are read from one array: when the token is the top-1 the two are equal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

MAX_TOP = 20  # alternatives per position the engine computes at most (OpenAI's completions: 5)


@dataclass
class TokenLogprobs:
    """Per position: the token, its log-probability (None: a prompt's first token, which nothing
    predicts) and its position's most likely tokens, most likely first, with theirs. What a door
    shows of them the output processing adds where it detokenizes: each token's text (special tokens
    spelled out) and the characters it adds to the decoded text (0 while a character is split, or for
    a special token the text leaves out); the core adds each token's offset in the text (query.py)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # token_ids' texts
    top_tokens: list[list[str]] = field(default_factory=list)  # top_ids' texts
    widths: list[int] = field(default_factory=list)  # characters each of token_ids adds to the text
    offsets: list[int] = field(default_factory=list)  # each token's character offset in prompt + completion

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, other: TokenLogprobs) -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.top_ids += other.top_ids
        self.top_logprobs += other.top_logprobs
        self.tokens += other.tokens
        self.top_tokens += other.top_tokens
        self.widths += other.widths
        self.offsets += other.offsets

    def take(self) -> TokenLogprobs:
        """The positions so far, leaving this one empty."""
        out = dataclasses.replace(self)
        for f in dataclasses.fields(self):
            setattr(self, f.name, [])
        return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(..., V) -> (..., V) float32 log-probabilities."""
    x = logits.astype(np.float32, copy=False)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def score(logits: np.ndarray, tokens, top: int) -> TokenLogprobs:
    """logits (T, V) of the positions that predict tokens (T,) -> their log-probabilities and the
    `top` most likely tokens of each position (0: none)."""
    lp = log_softmax(logits)  # (T, V)
    tokens = np.asarray(tokens, np.int64)
    chosen = lp[np.arange(len(tokens)), tokens]  # (T,)
    if top:
        part = np.argpartition(-lp, top - 1, axis=1)[:, :top]  # (T, top), unordered
        rank = np.argsort(-np.take_along_axis(lp, part, axis=1), axis=1, kind="stable")
        ids = np.take_along_axis(part, rank, axis=1)  # (T, top), most likely first
        top_ids, top_lps = ids.tolist(), np.take_along_axis(lp, ids, axis=1).tolist()
    else:
        top_ids = top_lps = [[] for _ in range(len(tokens))]
    return TokenLogprobs(tokens.tolist(), chosen.tolist(), top_ids, top_lps)


def prompt_scores(logits: np.ndarray, prompt: list[int], top: int) -> TokenLogprobs:
    """A prompt's prefill logits (T, V) -> every prompt token's score, the first one None."""
    out = TokenLogprobs([prompt[0]], [None], [[]], [[]])
    if len(prompt) > 1:
        out.extend(score(logits[: len(prompt) - 1], prompt[1:], top))
    return out


def joined(parts: list[TokenLogprobs | None]) -> TokenLogprobs | None:
    """Consecutive chunks' scores as one (None where none of them has any)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    out = TokenLogprobs()
    for p in present:
        out.extend(p)
    return out


def row_scores(asked: list[int | None], logits: np.ndarray, live: list[int], tokens: list) -> dict[int, TokenLogprobs]:
    """A decode step's rows (each row's `logprobs` asked, or None) -> row: its chosen token's raw
    log-probability and top alternatives, for the live rows that asked, in one pass over their logits."""
    rows = [(i, t, n) for i, t in zip(live, tokens) if (n := asked[i]) is not None and isinstance(t, int)]
    if not rows:
        return {}
    got = score(logits[[i for i, _, _ in rows]], [t for _, t, _ in rows], max(n for _, _, n in rows))
    return {
        i: TokenLogprobs([t], got.logprobs[j : j + 1], [got.top_ids[j][:n]], [got.top_logprobs[j][:n]])
        for j, (i, t, n) in enumerate(rows)
    }
