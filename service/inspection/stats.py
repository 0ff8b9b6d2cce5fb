"""Head statistics of attention maps, in numpy (the proto's HeadStats).

Every statistic is a mean over a map's rows (query positions i) of a quantity of the row's weights
w_ij over key positions j:
- entropy:       -sum_j w_ij ln w_ij (nats; 0 = all on one key, ln(keys) = uniform);
- mean_distance: sum_j w_ij |i - j|;
- to_special:    sum of w_ij over special-token keys ([CLS], [SEP], BOS/EOS);
- to_previous:   w_i,i-1 (rows with a previous position);
- to_self:       w_ii (rows with a key at the same position).
For CROSS maps positions are compared across the two sequences: the "self" diagonal is the
monotonic alignment target position i <-> source position i.
"""

from __future__ import annotations

import numpy as np

FIELDS = ("entropy", "mean_distance", "to_special", "to_previous", "to_self")


def head_stats(maps: np.ndarray, special: np.ndarray) -> np.ndarray:
    """maps (N, R, C) float32 rows summing to 1; special (C,) bool -> (N, 5) float64 in FIELDS order."""
    w = maps.astype(np.float64)
    rows, cols = w.shape[1:]
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(w > 0, w * np.log(w), 0.0)  # (N, R, C); 0 ln 0 = 0
    entropy = -plogp.sum(-1).mean(-1)  # (N,)
    distance = (w * np.abs(i - j)).sum(-1).mean(-1)
    to_special = w[..., special].sum(-1).mean(-1)
    out = np.zeros((len(w), len(FIELDS)))
    out[:, 0], out[:, 1], out[:, 2] = entropy, distance, to_special
    out[:, 3] = _diagonal_mean(w, -1)
    out[:, 4] = _diagonal_mean(w, 0)
    return out


def _diagonal_mean(w: np.ndarray, offset: int) -> np.ndarray:
    """Mean over rows of w[:, i, i + offset], over the rows where that key exists; 0 when none does."""
    diagonal = np.diagonal(w, offset=offset, axis1=1, axis2=2)  # (N, rows that have it)
    return diagonal.mean(-1) if diagonal.shape[-1] else np.zeros(len(w))
