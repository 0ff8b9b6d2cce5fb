"""The batched sampler against the per-row reference: the same tokens for any mix of settings and seeds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.generation.decoding import SamplingParams, make_rng, next_token
from service.generation.sampler import Row, choose_tokens


@st.composite
def row_params(draw, vocab: int) -> SamplingParams:
    greedy = draw(st.booleans())
    return SamplingParams(
        temperature=0.0 if greedy else draw(st.sampled_from([0.05, 0.3, 0.7, 1.0, 1.5, 4.0])),
        top_k=draw(st.sampled_from([0, 1, 2, 5, vocab - 1, vocab, vocab + 3])),
        top_p=draw(st.sampled_from([0.0, 0.05, 0.5, 0.9, 0.999, 1.0])),
        repetition_penalty=draw(st.sampled_from([0.0, 1.0, 0.7, 1.2, 3.0])),
        seed=draw(st.integers(0, 2**32)),
    )


@st.composite
def batches(draw):
    vocab = draw(st.integers(2, 300))
    params = draw(st.lists(row_params(vocab), min_size=1, max_size=8))
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    ties = draw(st.booleans())  # logits rounded to one decimal: many equal values (argpartition's tie order)
    seed = draw(st.integers(0, 2**32))
    return vocab, params, dtype, ties, seed


@settings(max_examples=150, deadline=None)
@given(batches())
def test_batched_sampling_equals_the_per_row_reference(batch):
    vocab, params, dtype, ties, seed = batch
    data = np.random.default_rng(seed)
    seen = [data.integers(0, vocab, size=data.integers(0, 12)) for _ in params]
    rows = [Row(p, s, make_rng(p.seed)) for p, s in zip(params, seen, strict=True)]
    reference_rngs = [make_rng(p.seed) for p in params]
    for _ in range(3):  # consecutive steps: every row's generator must advance as the reference's does
        logits = data.normal(0, 3, size=(len(params), vocab))
        logits = (np.round(logits, 1) if ties else logits).astype(dtype)
        expected = []
        for row, p, s, rng in zip(logits, params, seen, reference_rngs, strict=True):
            penalised = s if p.repetition_penalty not in (0.0, 1.0) else s[:0]
            expected.append(next_token(row, p, penalised, rng))
        assert choose_tokens(logits, rows) == expected


def test_a_row_that_raises_fails_alone():
    class Broken:
        def random(self):
            raise FloatingPointError("bad draw")

    logits = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
    sampled = SamplingParams(temperature=0.8, seed=1)
    rows = [
        Row(sampled, np.zeros(0, np.int64), make_rng(1)),
        Row(sampled, np.zeros(0, np.int64), Broken()),
        Row(SamplingParams(), np.zeros(0, np.int64), make_rng(None)),
    ]
    out = choose_tokens(logits, rows)
    assert isinstance(out[1], FloatingPointError)
    assert out[0] == next_token(logits[0], sampled, np.zeros(0, np.int64), make_rng(1))
    assert out[2] == int(np.argmax(logits[2]))


def test_greedy_rows_share_one_argmax_and_keep_the_penalty():
    logits = np.array([[3.0, 2.9, -1.0], [3.0, 2.9, -1.0]], np.float32)
    rows = [
        Row(SamplingParams(), np.asarray([0]), make_rng(None)),
        Row(SamplingParams(repetition_penalty=2.0), np.asarray([0, 0]), make_rng(None)),
    ]
    assert choose_tokens(logits, rows) == [0, 1]
