"""Speculative decoding by prompt lookup: drafts from the row's own tokens, verified in one pass.

No second model (Saxena's prompt lookup decoding; vLLM's `ngram` speculator, Hugging Face's
`prompt_lookup_num_tokens`): the last `n` tokens of a row (prompt and text so far; n = 3) are looked
up earlier in the same tokens, and the `DRAFT_TOKENS` tokens that followed their latest earlier
occurrence are the draft (`Lookup` keeps each row's n-grams indexed as it grows). One pass over the
row's cache (`SlotCache.extend`) feeds the last token and the draft and gives the model's logits
after each: the greedy token after the last one, then after each draft token while the draft agrees.
The agreeing draft tokens plus the model's own next token are the step's tokens (1 to k + 1),
exactly those plain greedy decoding picks one step at a time; the row's length is set back past the
rejected draft (its keys stay in the buffer, ignored by `seqlens_k`, and are overwritten later).

Who speculates: a greedy row whose token is the logits' argmax (no repetition, presence or
frequency penalty, no logit_bias, no grammar, no logprobs asked), with speculation on for it
(request `speculative`, else the server's `gen_speculate`), and only while it runs alone: the
graph's attention takes a multi-token pass over a past for one row at a time, so a batch of rows
would need a pass each where a plain step takes one for all. Sampled rows never speculate (their
draws, seeds and batch invariance stay those of plain decoding). A row whose drafts keep being
rejected pauses speculating for a while (`WINDOW`, `MIN_KEPT`, `PAUSE`): a pass costs more than a
step, so drafts that do not agree make decoding slower. docs/design/generation.md.
"""

from __future__ import annotations

import numpy as np

from service.generation import metrics
from service.generation.cache import SlotCache
from service.generation.sequence import Sequence

DRAFT_TOKENS = 4  # k: draft tokens verified per pass
# Drafts that grew after a fully kept pass (twice as long, up to 16 tokens: a pass of 17 tokens costs
# 3.08 steps on tinystories-gpt, 2.31 on a GPT-2-small-shaped fp32 graph) were tried on a quoting
# fine-tune of tinystories-gpt: quoting 1.44-1.53x against 1.40-1.48x with k = 4, free generation
# 0.88-0.90x against 0.99-1.14x (docs/performance.md); not kept.
# A pass of k + 1 tokens costs more than a step (1.62 steps at k = 4 on tinystories-gpt, CPU time):
# a row whose last WINDOW passes kept fewer than MIN_KEPT draft tokens each pauses for PAUSE steps.
WINDOW, MIN_KEPT, PAUSE = 4, 1.0, 16
# Suffix lengths looked up, longest first. On tinystories-gpt's outputs the last 3 tokens' drafts kept
# 0.94-1.56 tokens a pass; with 2 and 1 as fallbacks, twice as many passes kept 0.64-0.65 (under 1.65 - 1).
NGRAMS = (3,)
PROBE_TOKENS = 64  # pass_drift's sequence: a prefix, then the rest in one pass and one token at a time
DRIFT_LIMIT = 1e-3  # largest logit difference between passes that serves both features (fp32: ~1e-5)


class Lookup:
    """One row's drafts: up to k tokens that followed the latest earlier occurrence of its longest
    suffix (n in NGRAMS) found. Every n-gram of the row is indexed once, by where its latest
    occurrence ends, as the row grows, so a step's lookup costs a few dict reads where a scan of the
    whole row cost ~23 us at 200 tokens (7 % of a tinystories-gpt decode step's thread time,
    py-spy). A row's tokens only grow: rejected draft tokens never join them."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAMS}  # n -> n-gram -> its end
        self.indexed = dict.fromkeys(NGRAMS, 0)  # n -> n-grams indexed: those starting before it

    def draft(self, prompt: list[int], generated: list[int], k: int) -> list[int]:
        tokens = self.tokens
        if not tokens:
            tokens.extend(prompt)
        tokens.extend(generated[len(tokens) - len(prompt) :])
        for n in NGRAMS:
            if len(tokens) <= n:
                continue
            ends, first = self.ends[n], self.indexed[n]
            for start in range(first, len(tokens) - n):  # every n-gram but the suffix itself
                ends[tuple(tokens[start : start + n])] = start + n
            self.indexed[n] = max(first, len(tokens) - n)
            end = ends.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end : end + k]
        return []


def pass_drifts(cache: SlotCache) -> tuple[float, float]:
    """Compute thread, on an empty cache (at load): the largest logit differences of tokens computed
    in one pass continued from a prefix (what prefix caching and verification do) against (1) one
    whole prefill and (2) one decode step at a time (plain decoding). Prefix caching needs (1) to
    be small, speculation both: where a token's numbers depend on the kind of pass it is in (the
    row-wise int8 graph here: (2) up to 0.1; (1) is 0.0 on every graph here) greedy tokens change."""
    ids = np.random.default_rng(0).integers(1, cache.io.vocab_size, min(PROBE_TOKENS, cache.max_length)).tolist()
    half = len(ids) // 2
    if half < 2:  # a context of under 4 positions has no pass of several tokens to compare
        return 0.0, 0.0
    cache.prefill([ids[:half]])
    stepped = [cache.step([t])[0].copy() for t in ids[half:-1]]  # (V,) each: after ids[half..-2]
    cache.reset()
    cache.prefill([ids[:half]])
    continued = cache.extend(0, ids[half:-1])  # (T, V)
    cache.reset()
    whole = cache.prefill([ids[:-1]], every_position=True)[0, half:]  # (T, V)
    cache.reset()
    return float(np.abs(continued - whole).max()), float(np.abs(continued - np.stack(stepped)).max())


def eligible(seq: Sequence, default: bool) -> bool:
    """Whether the row's next tokens are plain argmaxes and it may speculate (module doc)."""
    p = seq.params
    on = default if p.speculative is None else p.speculative
    plain = not (p.repetition_penalty not in (0.0, 1.0) or p.presence_penalty or p.frequency_penalty)
    return on and p.greedy and plain and not p.logit_bias and p.constraint is None and p.logprobs is None


class Speculator:
    def __init__(self, name: str, cache: SlotCache, default: bool):
        self.cache, self.default = cache, default
        self.allowed = True  # False where the graph's passes disagree (pass_drift): no request speculates
        self._accepted = metrics.SPECULATIVE_TOKENS.labels(name, "accepted")
        self._rejected = metrics.SPECULATIVE_TOKENS.labels(name, "rejected")

    def step(self, seq: Sequence) -> list[int] | None:
        """Compute thread, for the one running row (buffer row 0): its next tokens from one verified
        draft, or None when it does not speculate this step (then a plain step runs)."""
        if seq.cancelled or not self.allowed or not eligible(seq, self.default):
            return None
        passes, kept, paused = seq.drafts
        if paused:
            seq.drafts = (passes, kept, paused - 1)
            return None
        start = int(self.cache.lengths[0])
        room = min(self.cache.max_length - start - 1, seq.params.max_new_tokens - len(seq.generated) - 1)
        if room <= 0:
            return None
        if seq.lookup is None:
            seq.lookup = Lookup()
        proposal = seq.lookup.draft(seq.prompt_ids, seq.generated, min(DRAFT_TOKENS, room))
        if not proposal:
            return None
        logits = self.cache.extend(0, [seq.generated[-1], *proposal])  # (k + 1, V)
        picked = np.argmax(logits, axis=1).tolist()
        agreed = 0
        while agreed < len(proposal) and proposal[agreed] == picked[agreed]:
            agreed += 1
        self.cache.lengths[0] = start + 1 + agreed  # the last token and the agreed draft; the rest rewound
        self._accepted.inc(agreed)
        self._rejected.inc(len(proposal) - agreed)
        passes, kept = passes + 1, kept + agreed
        if passes < WINDOW:
            seq.drafts = (passes, kept, 0)
        else:  # a new window, paused first where this one did not pay
            seq.drafts = (0, 0, PAUSE if kept < MIN_KEPT * passes else 0)
        return picked[: agreed + 1]
