"""Packed encoder batches: the tokens of several inputs share a row, attention stays within each input.

A padded batch pads every input to the batch's longest; with 16 mixed-length sentences about half
of what the encoder computes is padding. A packed batch (`pack`) places inputs into rows of at most
`row_tokens` tokens: as many rows as first-fit decreasing needs, then the inputs longest first each
into the emptiest row, so the rows end nearly level and the padded tails stay short (a row may pass
row_tokens by a little); int8 graphs start each input at a multiple of the CPU's SIMD width in floats
(`alignment`: 16 with AVX-512, else 8).
It gives the graph per-token `position_ids` (each input counts from 0) and `segment_ids` (1, 2, ...
per input within its row, 0 for padding). The packed graph (export/onnx/packed.py) lets a token
attend only to tokens of its own segment, so an input's result does not depend on its neighbours;
only the rows' tails are padding. An input longer than `row_tokens` gets a row of its own.

`pool` turns the graph's token states (rows, length, C) into one vector per input (mean, CLS or max
over its tokens, or its last token: a decoder embedder's), as the padded graph pools inside. The
export's gate and the service both pack through this module, so what the gate measured is what is
served.

A padded graph's batch may run in several passes instead (`split_runs`): its inputs sorted by
length and cut into runs of similar length, each padded to its own longest, where the tokens saved
outweigh the cost of one more session call (measured per model at load: service/engine/layout.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.runtime import cpu_info

# onnxruntime's vectorised reductions (softmax's sum over a row) group elements by their index
# modulo the SIMD width (8 floats with AVX2, 16 with AVX-512): an input starting elsewhere in a row
# sums its (same) values in other groups, about 1e-7 apart. fp32 graphs keep that (float rounding);
# an int8 graph's activation rounding can turn it into 2e-4 (tiny model) or 0.03 (a BERT-base int8
# embedder, offsets of 1), so there every input starts at a multiple of the width and computes exactly
# what it computes alone (0.0; tests/service/embedding/test_service_packed_rows.py), at the cost of
# padded tails: 16 where the CPU has AVX-512 (onnxruntime's widest x86 kernels), 8 elsewhere (AVX2;
# a multiple of NEON's 4). On an AVX2 CPU 8 rather than 16 cut a BERT-base embedder's computed tokens
# from 1.38 to 1.22 per real token (docs/design/packing.md).
ALIGNED_VARIANTS = ("int8",)


def simd_floats() -> int:
    """Floats in the widest vector onnxruntime's CPU kernels use here: 16 with AVX-512, else 8."""
    return 16 if "avx512f" in cpu_info()[1] else 8


def alignment(variant: str) -> int:
    """Where an input of a packed graph of this variant may start: any token (1), or a multiple of the
    CPU's SIMD width (`simd_floats`)."""
    return simd_floats() if variant in ALIGNED_VARIANTS else 1


@dataclass(frozen=True)
class Packed:
    """Graph inputs (rows, length) int64 and where each input landed: `row`, `start`, `length` (N,)."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    segment_ids: np.ndarray
    row: np.ndarray
    start: np.ndarray
    length: np.ndarray

    @property
    def computed_tokens(self) -> int:
        """Tokens the graph computes, padded tails included."""
        return int(self.input_ids.size)

    def flat_positions(self, offsets: Sequence[int] | np.ndarray, inputs: Sequence[int] | np.ndarray) -> np.ndarray:
        """Indices into the flattened (rows * length) tokens of token `offsets[k]` of input `inputs[k]`."""
        inputs = np.asarray(inputs, dtype=np.int64)
        return self.row[inputs] * self.input_ids.shape[1] + self.start[inputs] + np.asarray(offsets, dtype=np.int64)


def pack(seqs: Sequence[Sequence[int]], row_tokens: int, pad_id: int, align: int = 1) -> Packed:
    """Inputs into as few rows as first-fit decreasing needs at row_tokens, then balanced (module doc).
    Every input starts at a multiple of `align` tokens."""
    slots = [-(-len(s) // align) * align for s in seqs]  # tokens an input occupies, its tail padded
    order = sorted(range(len(seqs)), key=lambda i: -slots[i])
    fill: list[int] = []  # first-fit decreasing: how many rows
    for i in order:
        r = next((r for r, used in enumerate(fill) if used + slots[i] <= row_tokens), len(fill))
        if r == len(fill):
            fill.append(0)
        fill[r] += slots[i]
    fill = [0] * len(fill)  # then longest first into the emptiest row: the rows end level, little tail
    row = np.zeros(len(seqs), np.int64)
    start = np.zeros(len(seqs), np.int64)
    for i in order:
        r = min(range(len(fill)), key=fill.__getitem__)
        row[i], start[i] = r, fill[r]
        fill[r] += slots[i]
    width = max(fill)
    ids = np.full((len(fill), width), pad_id, np.int64)  # (R, L)
    positions = np.zeros((len(fill), width), np.int64)  # (R, L)
    segments = np.zeros((len(fill), width), np.int64)  # (R, L)
    segment_of_row = [0] * len(fill)
    for i in sorted(range(len(seqs)), key=lambda i: (row[i], start[i])):
        r, a, n = row[i], start[i], len(seqs[i])
        segment_of_row[r] += 1
        ids[r, a : a + n] = seqs[i]
        positions[r, a : a + n] = np.arange(n)
        segments[r, a : a + n] = segment_of_row[r]
    length = np.array([len(s) for s in seqs], np.int64)
    return Packed(ids, positions, segments, row, start, length)


def pool(hidden: np.ndarray, packed: Packed, mode: str) -> np.ndarray:
    """Token states (R, L, C) -> (N, C) float32: each input's mean, first token (cls), max, or last token."""
    flat = hidden.reshape(-1, hidden.shape[-1])  # (R*L, C)
    first = packed.row * hidden.shape[1] + packed.start  # (N,)
    if mode == "cls":
        return np.asarray(flat[first], dtype=np.float32)
    if mode == "last":
        return np.asarray(flat[first + packed.length - 1], dtype=np.float32)
    order = np.argsort(first)  # reduceat wants ascending, contiguous segments
    index = np.repeat(first[order], packed.length[order]) + _ranges(packed.length[order])  # every real token
    starts = np.concatenate([[0], np.cumsum(packed.length[order])[:-1]])
    tokens = flat[index].astype(np.float32)  # (sum of lengths, C)
    if mode == "max":
        pooled = np.maximum.reduceat(tokens, starts, axis=0)
    else:
        pooled = np.add.reduceat(tokens, starts, axis=0) / packed.length[order][:, None]
    out = np.empty_like(pooled)
    out[order] = pooled
    return out


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """[3, 2] -> [0, 1, 2, 0, 1]."""
    ends = np.cumsum(lengths)
    return np.arange(ends[-1]) - np.repeat(ends - lengths, lengths)


def split_runs(lengths: Sequence[int], pass_tokens: float) -> list[list[int]]:
    """A padded batch's inputs (indices) in runs of similar length, each run one padded pass of
    the encoder: the split of the length-sorted inputs that computes the fewest tokens (rows x
    longest, summed over the runs) with every pass counted `pass_tokens` more, what one more
    session call costs (an optimal partition of the sorted lengths, O(n^2) for n inputs). One run
    when the batch's padding is under a pass's cost: no split can gain then."""
    n = len(lengths)
    if n < 2 or n * max(lengths) - sum(lengths) <= pass_tokens:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: lengths[i])
    width = [lengths[i] for i in order]
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)  # best[j]: the first j sorted inputs
    for j in range(1, n + 1):
        for i in range(j):  # inputs i..j-1 as one run, padded to width[j - 1]
            cost = best[i] + (j - i) * width[j - 1] + pass_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], n
    while j:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]
