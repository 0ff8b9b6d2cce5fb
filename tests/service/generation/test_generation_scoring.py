"""service/generation/scoring.py against a float64 numpy log-softmax, on random logits."""

from __future__ import annotations

import numpy as np

from service.generation.scoring import TokenLogprobs, joined, prompt_scores, score


def reference(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_scores_and_top_n_match_a_float64_log_softmax():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((7, 300)) * 4).astype(np.float32)  # (T, V)
    tokens = rng.integers(0, 300, 7)
    got = score(logits, tokens, top=5)
    ref = reference(logits)
    assert got.token_ids == tokens.tolist()
    assert np.allclose(got.logprobs, ref[np.arange(7), tokens], atol=1e-5, rtol=0)
    for row, ids, values in zip(ref, got.top_ids, got.top_logprobs, strict=True):
        assert ids == np.argsort(-row, kind="stable")[:5].tolist()  # most likely first
        assert np.allclose(values, row[ids], atol=1e-5, rtol=0)


def test_a_top_1_token_scores_exactly_its_top_value():
    logits = np.asarray([[0.1, 3.0, -2.0], [5.0, 5.5, 0.0]], np.float32)
    got = score(logits, [1, 1], top=1)
    assert got.top_ids == [[1], [1]] and got.logprobs == [got.top_logprobs[0][0], got.top_logprobs[1][0]]


def test_prompt_scores_start_with_none_and_read_each_position_at_the_next_token():
    rng = np.random.default_rng(1)
    prompt = [3, 9, 4, 1]
    logits = rng.standard_normal((len(prompt), 12)).astype(np.float32)  # the prefill's, one row per position
    got = prompt_scores(logits, prompt, top=0)
    assert got.token_ids == prompt and got.logprobs[0] is None and got.top_ids == [[], [], [], []]
    assert np.allclose(got.logprobs[1:], reference(logits)[[0, 1, 2], prompt[1:]], atol=1e-5, rtol=0)
    assert prompt_scores(logits[:1], [7], top=3).logprobs == [None]  # one token: nothing predicts it


def test_joined_concatenates_in_order_and_keeps_none():
    a = TokenLogprobs([1], [-0.5], [[1]], [[-0.5]])
    b = TokenLogprobs([2, 3], [-1.0, -2.0], [[2], [0]], [[-1.0], [-0.1]])
    both = joined([a, None, b])
    assert both.token_ids == [1, 2, 3] and both.logprobs == [-0.5, -1.0, -2.0] and both.top_ids == [[1], [2], [0]]
    assert joined([None, None]) is None
