"""The decoder batch of a translation model: rows of many sources that join and leave between steps.

`Seq2SeqBatch` holds, for R rows (each source's k rows contiguous, in `sources` order):
- the decoder's self-attention KV cache (cache.SlotBatch: each row left-aligned in its buffer
  with its own length; a source that joined later has fewer cached positions);
- the cross-attention K/V its encoder produced once per source, (R, H, S, D) per layer, and the
  source mask (R, S), right-padded to the longest source present (padding masked, trimmed when
  that source leaves); on CUDA uploaded to the device once per batch composition;
- the position each row feeds next (its source's own step count, as position_ids).
`join` adds encoded sources, `step` runs one decoder call for every row and advances every
source (search.advance_batch), `drop` removes sources (cancelled calls). A row's attention only
sees its own slots and its own source, so its logits do not depend on who else is in the batch.
"""

from __future__ import annotations

import numpy as np

from service.engine.graphio import GraphIO, to_device
from service.translation.cache import SlotBatch
from service.translation.search import SourceSearch, advance_batch


class Seq2SeqBatch:
    def __init__(self, session, io: GraphIO, device: str | None, max_positions: int):
        """max_positions: the decoder's positions (the most a row may cache)."""
        self.session, self.io, self.device, self.max_positions = session, io, device, max_positions
        self.cross_names = tuple(n.replace("past_key_values", "cross_key_values") for n in io.past_names)
        self.cache = SlotBatch(io, max_positions, device)
        self.sources: list[SourceSearch] = []
        self._cross: list[np.ndarray] | None = None  # each (R, H, S, D)
        self._src_mask = np.zeros((0, 0), np.int64)  # (R, S)
        self._bound: dict | None = None

    @property
    def rows(self) -> int:
        return self.cache.rows

    def join(self, sources: list[SourceSearch], cross: list[np.ndarray], src_mask: np.ndarray) -> None:
        """Adds sources whose encoder outputs are cross (n, H, S', D) per layer and src_mask (n, S');
        each source's row is repeated k times."""
        rows = np.repeat(np.arange(len(sources)), [s.k for s in sources])
        cross, src_mask = [c[rows] for c in cross], src_mask[rows]
        width = max(self._src_mask.shape[1], src_mask.shape[1])
        if self._cross is None:
            self._cross, self._src_mask = [_pad_s(c, width) for c in cross], _pad_s(src_mask, width)
        else:
            self._cross = [np.concatenate([_pad_s(a, width), _pad_s(b, width)]) for a, b in zip(self._cross, cross)]
            self._src_mask = np.concatenate([_pad_s(self._src_mask, width), _pad_s(src_mask, width)])
        self.cache.add_rows(len(rows))
        self.sources.extend(sources)
        self._bound = None

    def step(self) -> list[tuple[SourceSearch, BaseException | None]]:
        """One decoder call for every row; returns (source, exception or None) for the sources that
        ended (finished, or failed alone). A failing decoder call raises and leaves the batch as it was."""
        if self._cross is None:
            raise RuntimeError("translation batch step before any source joined")
        if self._bound is None:
            constants = {**dict(zip(self.cross_names, self._cross)), "encoder_attention_mask": self._src_mask}
            self._bound = to_device(constants, self.device)
        tokens = np.concatenate([s.last for s in self.sources])  # (R,)
        positions = np.repeat([s.steps for s in self.sources], [s.k for s in self.sources])  # (R,)
        feeds = {"input_ids": tokens[:, None], "position_ids": positions[:, None].astype(np.int64)}  # (R, 1) each
        logits = self.cache.step(self.session, feeds, self._bound)  # (R, V)
        keep, self.sources, ended = advance_batch(self.sources, logits)
        if keep.size != logits.shape[0] or np.any(keep != np.arange(keep.size)):
            self._select(keep)
        return ended

    def drop(self, gone: set[int]) -> None:
        """Removes the sources whose id() is in gone, with their rows."""
        keep, still, start = [], [], 0
        for s in self.sources:
            if id(s) not in gone:
                keep.append(np.arange(start, start + s.k))
                still.append(s)
            start += s.k
        if len(still) < len(self.sources):
            self.sources = still
            self._select(np.concatenate(keep) if keep else np.zeros(0, np.int64))

    def clear(self) -> None:
        self.sources = []
        self._select(np.zeros(0, np.int64))

    def _select(self, rows: np.ndarray) -> None:
        """Keeps (re-orders, repeats) rows of cache, cross K/V and source mask; trims source padding."""
        self.cache.select(rows)
        mask = self._src_mask[rows]  # (R', S)
        used = np.flatnonzero(mask.any(axis=0))
        width = int(used[-1]) + 1 if used.size else 0
        self._src_mask = np.ascontiguousarray(mask[:, :width])
        if self._cross is not None:  # None until a source joins
            self._cross = [c[rows, :, :width] for c in self._cross]  # (R', H, S', D), a contiguous copy
        self._bound = None


def _pad_s(a: np.ndarray, width: int) -> np.ndarray:
    """Right-pads the source axis (axis 1 of a mask (n, S), axis 2 of cross K/V (n, H, S, D)) with zeros."""
    axis = 1 if a.ndim == 2 else 2
    if a.shape[axis] == width:
        return a
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, width - a.shape[axis])
    return np.pad(a, pad)
