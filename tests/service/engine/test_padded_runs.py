"""A padded batch in runs of similar length (service/engine/packing.py `split_runs`, the padded
engines' `in_runs`, service/engine/layout.py `measure_pass`).

The split is checked against every contiguous split of the sorted lengths; a real padded embedder
over tiny-embed answers a batch in runs as it answers it in one pass, rows in batch order; the
load's measurement recovers the cost of a pass from an engine whose passes take a set time.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from service.embedding.engine import EmbeddingEngine
from service.embedding.model import load_engine
from service.engine.layout import measure_pass, sample_batch
from service.engine.packing import split_runs
from service.engine.tokenization import Encoded
from service.manifest import load_model_dir
from service.runtime import Runtime
from service.settings import Settings


def cost(lengths: list[int], runs: list[list[int]], pass_tokens: float) -> float:
    return sum(len(r) * max(lengths[i] for i in r) + pass_tokens for r in runs)


def cheapest(lengths: list[int], pass_tokens: float) -> float:
    """Every split of the length-sorted inputs into contiguous runs, the cheapest one's cost."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = float("inf")
    for cuts in itertools.product((False, True), repeat=len(order) - 1):
        runs, run = [], [order[0]]
        for i, cut in zip(order[1:], cuts):
            if cut:
                runs.append(run)
                run = []
            run.append(i)
        best = min(best, cost(lengths, [*runs, run], pass_tokens))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_split_is_the_cheapest_and_keeps_every_input_once(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 257, size=int(rng.integers(2, 10))).tolist()
    pass_tokens = float(rng.choice([0, 2, 16, 64, 400]))
    runs = split_runs(lengths, pass_tokens)
    assert sorted(i for r in runs for i in r) == list(range(len(lengths)))
    assert cost(lengths, runs, pass_tokens) == pytest.approx(cheapest(lengths, pass_tokens))
    widths = [max(lengths[i] for i in r) for r in runs]
    assert widths == sorted(widths)  # runs of the sorted order: each a contiguous length range


def test_a_batch_whose_padding_costs_less_than_a_pass_stays_whole():
    assert split_runs([10, 12, 11, 12], pass_tokens=5) == [[0, 1, 2, 3]]
    assert split_runs([7], pass_tokens=0) == [[0]]
    assert split_runs([3, 200, 4, 190], pass_tokens=12) == [[0, 2], [3, 1]]


@pytest.fixture
def padded(embed_models_root: Path):
    d = Path(embed_models_root) / "tiny-embed"
    settings = Settings.from_env(env={}, models=str(d.parent), encoder_layout="padded")
    runtime = Runtime(settings)
    try:
        yield cast(EmbeddingEngine, load_engine(load_model_dir(d), settings, runtime)[1])
    finally:
        runtime.close()


def test_a_padded_batch_in_runs_answers_as_one_pass(padded):
    engine = padded
    rng = np.random.default_rng(1)
    batch = [Encoded(rng.integers(5, 200, size=n).tolist(), [0] * n) for n in (3, 40, 5, 41, 120, 4, 39, 118)]
    passes = []
    one_pass = engine._pass

    def counted(inputs):
        passes.append(sorted(len(e) for e in inputs))
        return one_pass(inputs)

    engine._pass = counted  # type: ignore[method-assign]
    engine.pass_tokens = None
    whole = engine.forward(batch)
    engine.pass_tokens = 0.0  # every distinct width a run of its own
    in_runs = engine.forward(batch)
    assert passes == [[3, 4, 5, 39, 40, 41, 118, 120], [3], [4], [5], [39], [40], [41], [118], [120]]
    np.testing.assert_allclose(in_runs, whole, rtol=0, atol=1e-5)  # float rounding of the padding only
    alone = np.concatenate([one_pass([e]) for e in batch])
    np.testing.assert_array_equal(in_runs, alone)  # a run of one input is that input alone, in batch order


class Paced:
    """A padded engine whose passes take `fixed_s` plus `per_token_s` per padded token."""

    counted, pass_tokens = True, None

    def __init__(self, fixed_s: float, per_token_s: float):
        self.fixed_s, self.per_token_s = fixed_s, per_token_s

    def forward(self, batch):
        time.sleep(self.fixed_s + self.per_token_s * len(batch) * max(len(e) for e in batch))


def test_the_load_measures_what_one_more_pass_costs():
    engine = Paced(fixed_s=0.004, per_token_s=0.00005)  # a pass costs 80 tokens
    got = measure_pass(engine, sample_batch(vocab=256, longest=512))
    assert got is not None and 50 <= got <= 130, got  # sleeps overshoot a little: a loaded machine's noise
    assert engine.counted is True and engine.pass_tokens is None  # the caller sets what was measured


def test_a_fill_mask_batch_in_runs_answers_as_one_pass(fill_models_root):
    import onnxruntime as ort

    from service.fillmask.engine import FillMaskEngine

    d = Path(fill_models_root) / "tiny-fill-mask"
    m = load_model_dir(d).manifest
    mask, pad = int(m.special_tokens["mask"]), int(m.special_tokens["pad"])
    session = ort.InferenceSession(str(d / m.graph("encoder", "fp32").file), providers=["CPUExecutionProvider"])
    engine = FillMaskEngine(session, pad, mask, keep=5)
    rng = np.random.default_rng(2)
    batch = []
    for n in (4, 30, 6, 31, 5, 29):
        ids = rng.integers(10, 200, size=n)
        ids[1 : n : max(2, n // 3)] = mask  # masks at several places, one input's masks in order
        batch.append(Encoded(ids.tolist(), [0] * n))
    whole = engine.forward(batch)
    engine.pass_tokens = 0.0
    in_runs = engine.forward(batch)
    assert len(in_runs) == len(batch)
    for a, b, e in zip(in_runs, whole, batch, strict=True):
        assert len(a.token_ids) == e.ids.count(mask)
        np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=1e-5)
        # the same tokens, save where two scores tie within rounding (their order may swap)
        gaps = np.diff(b.scores, axis=1, prepend=np.inf, append=-np.inf)
        clear = (np.abs(gaps[:, :-1]) > 1e-5) & (np.abs(gaps[:, 1:]) > 1e-5)
        np.testing.assert_array_equal(a.token_ids[clear], b.token_ids[clear])
