"""Prefix caching for one generation model: a prompt that starts with tokens already in the KV cache
is not prefilled again from its start.

The sources are the cache's rows: the live rows (a prompt's tokens and what it generated so far) and
finished rows kept in the free rows above them (`kept`, least recently used evicted first). A
newcomer whose prompt shares at least `MIN_TOKENS` whole leading tokens with one of them gets a new
row holding a copy of those tokens' keys and values (`SlotCache.fork`, a device-side row copy) and
prefills only the rest (`SlotCache.extend`, one pass over that row's past); the others are
prefilled together as before. Newcomers of one turn share too: a later one may start from an
earlier one's row (misses are prefilled first, then the hits in order).

Bounded by the cache itself: finished rows live only in rows no request uses; before newcomers take
rows, the kept rows in their way move up or, short of free rows, the least recently used are
dropped (`make_room`), so a kept row never keeps a request from a row. With CUDA graphs on, no
finished row is kept (a captured step pads its rows with free buffer rows and writes their first
slot). A request that scores its prompt (prompt_logprobs) is always prefilled whole: it needs every
position's logits. At least the last 2 prompt tokens are computed: a pass of one token takes the
decode kernels, whose last bits differ (~1e-6) from a whole prefill's; a pass of 2 or more gives
the whole prefill's logits bit for bit (max |diff| 0.0 on tinystories-gpt's fp32, optimized, fp16
and int8 graphs and the test models), so greedy tokens and logprobs are those without the cache.
docs/design/generation.md ("Prefix caching").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.generation import metrics
from service.generation.cache import SlotCache
from service.generation.sequence import Sequence

MIN_TOKENS = 8  # shorter shared prefixes are prefilled again: the row copy and a batch-1 pass cost more


def common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def head(tokens: list[int]) -> tuple[int, ...]:
    """The first MIN_TOKENS tokens: only sources that share them can give a prefix worth copying, so
    only those are compared (a newcomer among 64 live rows and the kept ones compares a few, not all)."""
    return tuple(tokens[:MIN_TOKENS])


@dataclass
class Kept:
    tokens: np.ndarray  # the tokens whose keys the row holds
    used: int  # the tick of its last use (LRU)
    head: tuple[int, ...]  # head(tokens): its key among the sources (`_plans`)


@dataclass
class Plan:
    """How one newcomer is prefilled: `cached` tokens from a source, the rest computed."""

    cached: int = 0
    row: int | None = None  # source: a buffer row (live or kept) ...
    newcomer: int | None = None  # ... or an earlier newcomer of the same turn


class PrefixCache:
    def __init__(self, name: str, cache: SlotCache, enabled: bool):
        self.cache, self.enabled = cache, enabled
        self.kept: dict[int, Kept] = {}  # buffer row (never an active one) -> a finished row kept
        self._tick = 0
        self._lookups = metrics.PREFIX_LOOKUPS.labels(name)
        self._hits = metrics.PREFIX_HITS.labels(name)
        self._cached = metrics.PREFIX_CACHED_TOKENS.labels(name)

    def prefill(self, seqs: list[Sequence], running: list[Sequence]) -> tuple[list[Sequence], np.ndarray, np.ndarray]:
        """Compute thread: the newcomers become rows after the running ones. -> (the newcomers in
        row order, their last-position logits (n, V), every position's logits of the wholly
        prefilled ones when one of them scores its prompt (else an empty array))."""
        self.make_room(len(seqs))
        plans = self._plans(seqs, running)
        misses = [i for i, p in enumerate(plans) if not p.cached]
        hits = [i for i, p in enumerate(plans) if p.cached]
        order, start = misses + hits, self.cache.rows
        last: list[np.ndarray] = []
        every = np.empty(0)
        if misses:
            prompts = [seqs[i].cache_ids for i in misses]
            scored = any(seqs[i].params.prompt_logprobs is not None for i in misses)
            logits = self.cache.prefill(prompts, every_position=scored)  # (n, V), or (n, T, V) if scored
            if scored:
                every, logits = logits, logits[np.arange(len(prompts)), [len(p) - 1 for p in prompts]]
            last.extend(logits)
        row_of = {i: start + k for k, i in enumerate(order)}
        for i in hits:
            plan, seq = plans[i], seqs[i]
            source = row_of[plan.newcomer] if plan.newcomer is not None else int(plan.row or 0)
            row = self.cache.fork(source, plan.cached)
            last.append(self.cache.extend(row, seq.cache_ids[plan.cached :], every_position=False)[-1])
            seq.cached_tokens = plan.cached
            self._hits.inc()
            self._cached.inc(plan.cached)
        self._lookups.inc(len(seqs))
        return [seqs[i] for i in order], np.stack(last), every

    def _plans(self, seqs: list[Sequence], running: list[Sequence]) -> list[Plan]:
        """Each newcomer's longest shared prefix among the live rows, the kept rows and the newcomers
        before it (the first of them on a tie, in that order), compared only with those of its head."""
        lengths = self.cache.lengths
        # head -> its sources in order: a live row (its tokens read only when compared), a kept row,
        # an earlier newcomer
        sources: dict[tuple[int, ...], list[tuple[Plan, np.ndarray | None]]] = {}
        if self.enabled:
            for r, s in enumerate(running):
                if lengths[r] >= MIN_TOKENS:
                    key = head(s.prompt_ids if len(s.prompt_ids) >= MIN_TOKENS else s.cache_ids)
                    sources.setdefault(key, []).append((Plan(row=r), None))
            for r, k in self.kept.items():
                sources.setdefault(k.head, []).append((Plan(row=r), k.tokens))
        plans: list[Plan] = []
        for j, seq in enumerate(seqs):
            ids = seq.cache_ids
            plan = Plan()
            if self.enabled and seq.params.prompt_logprobs is None and len(ids) >= MIN_TOKENS:
                limit = len(ids) - 2  # a pass of 2 tokens at least: the prompt kernels, as a whole prefill's
                array = np.asarray(ids)
                for source, tokens in sources.get(head(ids), ()):
                    if tokens is None:  # a live row
                        row = int(source.row or 0)
                        tokens = np.asarray(running[row].cache_ids[: lengths[row]])
                    if (n := min(common(array, tokens), limit)) > plan.cached:
                        plan = Plan(n, source.row, source.newcomer)
                if plan.cached < MIN_TOKENS:
                    plan = Plan()
                elif plan.row in self.kept:
                    self._tick += 1
                    self.kept[plan.row].used = self._tick
            if self.enabled and len(ids) >= MIN_TOKENS:
                sources.setdefault(head(ids), []).append((Plan(newcomer=j), np.asarray(ids)))
            plans.append(plan)
        return plans

    def make_room(self, n: int) -> None:
        """Rows [B, B + n) free for newcomers: kept rows there move up, the least recently used
        dropped where the free rows above do not suffice."""
        end = self.cache.rows + n
        while self.kept and len(self.kept) > self.cache.capacity - end:
            del self.kept[min(self.kept, key=lambda r: self.kept[r].used)]
        blocking = [r for r in self.kept if r < end]
        if not blocking:
            return
        free = [r for r in range(end, self.cache.capacity) if r not in self.kept]
        moves = list(zip(free, blocking))
        self.cache.copy_rows(moves)
        for dst, src in moves:
            self.kept[dst] = self.kept.pop(src)
            self.cache.lengths[dst] = self.cache.lengths[src]

    def retain(self, row: int, tokens: list[int]) -> None:
        """Compute thread, before a finished row leaves: its tokens' keys are kept in a free row (one
        it supersedes, else a free one, else the least recently used kept row's)."""
        if not self.enabled or self.cache.graphs or len(tokens) < MIN_TOKENS:
            return
        ids, key = np.asarray(tokens), head(tokens)
        self._tick += 1
        for r, kept in list(self.kept.items()):
            if kept.head != key:  # shares fewer than MIN_TOKENS <= both lengths: neither case below
                continue
            shared = common(kept.tokens, ids)
            if shared == len(ids):  # already held, as this row or the start of a longer one
                kept.used = self._tick
                return
            if shared == len(kept.tokens):  # the new row holds all of it and more
                del self.kept[r]
        free = [r for r in range(self.cache.rows, self.cache.capacity) if r not in self.kept]
        if free:
            slot = free[-1]
        elif self.kept:
            slot = min(self.kept, key=lambda r: self.kept[r].used)
        else:
            return
        self.cache.copy_rows([(slot, row)])
        self.cache.lengths[slot] = len(ids)
        self.kept[slot] = Kept(ids, self._tick, key)
