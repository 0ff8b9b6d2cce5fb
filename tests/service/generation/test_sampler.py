"""The batched sampler: sampling semantics (Hugging Face's repetition penalty, temperature, top-k,
top-p, seeds) and the same tokens as a per-row reference, written here, for any mix of settings."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.generation.decoding import SamplingParams, check_params, make_rng
from service.generation.sampler import Row, _draw_unranked, _top_candidates, choose_tokens

NO_SEEN = np.zeros(0, np.int64)


def reference_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """HF semantics, one row: each seen token's logit / penalty if > 0 else logit * penalty (once per id)."""
    if penalty in (0.0, 1.0) or seen.size == 0:
        return logits
    logits = logits.copy()
    ids = np.unique(seen)
    vals = logits[ids]
    logits[ids] = np.where(vals > 0, vals / penalty, vals * penalty)
    return logits


def reference_token(logits: np.ndarray, p: SamplingParams, seen: np.ndarray, rng: np.random.Generator) -> int:
    """One row of logits (V,) -> its token, sampled alone: argmax when greedy; with top_k, one draw
    among the first top_k of the whole vocabulary ranked (stable order: ties at the k-th score keep
    the lower ids) whose mass before each is under top_p, renormalised;
    without, the whole vocabulary ranked (stable order) for top_p, else one draw in token-id order."""
    scores = reference_penalty(logits, seen, p.repetition_penalty)
    if p.greedy:
        return int(np.argmax(scores))
    s = scores.astype(np.float64) / p.temperature
    top_p = 0.0 < p.top_p < 1.0
    if 0 < p.top_k < s.size:
        order = np.argsort(-s, kind="stable")[: p.top_k]
        probs = np.exp(s[order] - s[order[0]])
        probs /= probs.sum()
    elif top_p:
        e = np.exp(s - s.max())
        order = np.argsort(-s, kind="stable")
        probs = e[order] / e.sum()
    else:
        cdf = np.cumsum(np.exp(s - s.max()))
        return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), s.size - 1)
    if top_p:
        before = np.cumsum(probs) - probs  # mass ranked above each token
        reached = np.flatnonzero(before >= p.top_p)
        n = max(1, int(reached[0])) if reached.size else probs.size
        probs, order = probs[:n] / probs[:n].sum(), order[:n]
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(order[min(i, order.size - 1)])


def one(logits: np.ndarray, p: SamplingParams, seen: np.ndarray = NO_SEEN, rng=None) -> int | Exception:
    """The batched sampler on one row."""
    row = Row(p, seen, None if p.greedy else rng or make_rng(p.seed))
    return choose_tokens(np.asarray(logits)[None, :], [row])[0]


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
            expected.append(reference_token(row, p, penalised, rng))
        assert choose_tokens(logits, rows) == expected


def test_a_row_that_raises_fails_alone():
    class Broken:
        def random(self):
            raise FloatingPointError("bad draw")

    logits = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
    sampled = SamplingParams(temperature=0.8, seed=1)
    rows = [
        Row(sampled, NO_SEEN, make_rng(1)),
        Row(sampled, NO_SEEN, Broken()),
        Row(SamplingParams(), NO_SEEN, make_rng(None)),
    ]
    out = choose_tokens(logits, rows)
    assert isinstance(out[1], FloatingPointError)
    assert out[0] == reference_token(logits[0], sampled, NO_SEEN, make_rng(1))
    assert out[2] == int(np.argmax(logits[2]))


def test_greedy_rows_share_one_argmax_and_keep_the_penalty():
    logits = np.array([[3.0, 2.9, -1.0], [3.0, 2.9, -1.0]], np.float32)
    rows = [
        Row(SamplingParams(), np.asarray([0]), make_rng(None)),
        Row(SamplingParams(repetition_penalty=2.0), np.asarray([0, 0]), make_rng(None)),
    ]
    assert choose_tokens(logits, rows) == [0, 1]


@pytest.mark.parametrize(
    "logits, seen, expected",
    [
        ([2.0, 1.5], [0], 1),  # a positive logit is divided: 2 / 2 = 1 < 1.5
        ([-1.0, -1.5], [0], 1),  # a negative one is multiplied: -2 < -1.5 (dividing would keep token 0)
        ([2.0, 0.9], [0, 0, 0], 0),  # a token seen three times is penalised once: 1 > 0.9
        ([0.1, 3.0, 2.0], [], 1),  # nothing seen: plain argmax
    ],
)
def test_repetition_penalty_follows_hf_semantics(logits, seen, expected):
    params = SamplingParams(repetition_penalty=2.0)
    assert one(np.asarray(logits, np.float32), params, np.asarray(seen, np.int64)) == expected


@pytest.mark.parametrize(
    "params",
    [  # the edges of every documented range (docs/api.md) are inside it and sample a token
        SamplingParams(temperature=0.0, top_p=0.0, repetition_penalty=0.0),
        SamplingParams(temperature=1e-3, top_p=1.0, repetition_penalty=1e-3),
        SamplingParams(temperature=1e3, top_k=1_000_000, repetition_penalty=1e3, seed=2**64 - 1),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.2, stop=("\n",), seed=3),
    ],
)
def test_params_at_the_edges_of_their_ranges_sample(params):
    assert check_params(params) is None
    assert one(np.asarray([1.0, -30.0, 5.0, 30.0, -2.0], np.float32), params, np.asarray([1])) in range(5)


# float32 logits as the graph returns them; tokens 3 and 1 were seen, token 3 has the largest logit
LOGITS, SEEN = np.asarray([1.0, -30.0, 5.0, 30.0, -2.0], np.float32), np.asarray([3, 1])


@pytest.mark.parametrize(
    "penalty, temperature, expected",
    [
        (1e-3, 1e-3, {3}),  # 30 / 1e-3 grows further ahead: all mass on token 3
        (1e3, 1e-3, {2}),  # 30 / 1e3 = 0.03 falls behind token 2's 5.0: all mass on token 2
        (1e-3, 1e3, {3}),  # 3e4 / 1e3 = 30 still dwarfs 5 / 1e3: all mass on token 3
        (1.0, 1e3, {0, 1, 2, 3, 4}),  # logits / 1e3 are within 0.06 of each other: every token is drawn
    ],
)
def test_extreme_allowed_scales_keep_sampling_finite(penalty, temperature, expected):
    params = SamplingParams(temperature=temperature, repetition_penalty=penalty, seed=0)
    check_params(params)
    scores = reference_penalty(LOGITS, SEEN, penalty).astype(np.float64) / temperature
    assert np.isfinite(scores).all()
    rows = [Row(params, SEEN, make_rng(seed)) for seed in range(100)]  # 100 seeds, one batch
    assert set(choose_tokens(np.tile(LOGITS, (100, 1)), rows)) == expected


def test_top_k_one_is_greedy_and_seed_reproduces():
    logits = np.random.default_rng(1).normal(size=100)
    assert one(logits, SamplingParams(temperature=1.0, top_k=1), rng=make_rng(None)) == int(np.argmax(logits))
    q = SamplingParams(temperature=1.3, top_p=0.8, seed=7)
    a, b = make_rng(7), make_rng(7)
    drawn = [one(logits, q, rng=a) for _ in range(20)]
    assert drawn == [one(logits, q, rng=b) for _ in range(20)] and len(set(drawn)) > 1


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = make_rng(0)
    assert {one(logits, SamplingParams(temperature=1.0, top_p=0.7), rng=rng) for _ in range(300)} == {0, 1}


SCALES = {"peaked": 6.0, "flat": 0.05, "tied": 2.0, "holes": 1.0}


def shaped_logits(data: np.random.Generator, rows: int, vocab: int, shape: str, holes: float = 0.5) -> np.ndarray:
    """(rows, vocab) float64 logits: peaked, flat, tied (rounded: runs of equal scores), or with
    holes (that share of the vocabulary at -inf)."""
    logits = data.normal(0, SCALES[shape], size=(rows, vocab))
    if shape == "tied":
        logits = np.round(logits)
    if shape == "holes":
        logits[:, data.random(vocab) < holes] = -np.inf
    return logits


def steps_equal_the_reference(logits: np.ndarray, params: list[SamplingParams], steps: int) -> list[list[int]]:
    """`steps` consecutive steps of the batched sampler on the same logits, each equal to the
    reference's tokens row by row (every row's generator advancing as the reference's) -> the tokens."""
    rows = [Row(p, NO_SEEN, make_rng(p.seed)) for p in params]
    expected_rngs = [make_rng(p.seed) for p in params]
    tokens = []
    for _ in range(steps):
        expected = [
            reference_token(row, p, NO_SEEN, rng) for row, p, rng in zip(logits, params, expected_rngs, strict=True)
        ]
        got = choose_tokens(logits, rows)
        assert got == expected
        tokens.append(got)
    return tokens


@pytest.mark.parametrize("vocab", [5_000, 50_257])
@pytest.mark.parametrize("shape", ["peaked", "flat", "tied"])
def test_top_p_at_real_vocabulary_sizes_equals_ranking_the_whole_vocabulary(vocab, shape):
    """The nucleus is found among the likeliest candidates (64, then 8x more), never by sorting the
    vocabulary; peaked logits end inside the first 64, flat ones grow the candidates to the whole
    vocabulary, tied ones put the candidates' edge inside a run of equal scores."""
    logits = shaped_logits(np.random.default_rng(vocab), 6, vocab, shape).astype(np.float32)
    params = [
        SamplingParams(temperature=t, top_p=q, seed=i)
        for i, (t, q) in enumerate([(0.7, 0.9), (1.0, 0.5), (1.3, 0.95), (0.5, 0.999), (1.0, 0.05), (0.9, 0.8)])
    ]
    steps_equal_the_reference(logits, params, 3)


@pytest.mark.parametrize("vocab", [255, 256, 257, 5_000, 50_257, 151_936])
@pytest.mark.parametrize("shape", ["peaked", "flat", "tied", "holes"])
def test_the_unranked_draw_by_blocks_equals_one_running_sum(vocab, shape):
    """Without top-k and top-p the draw finds its block of 256 tokens, then its token in it: the
    reference's one running sum over the vocabulary gives the same tokens at real vocabulary sizes
    (vocabularies around one block, GPT-2's, Qwen's), and a token of zero probability (`holes`:
    whole blocks and scattered tokens at -inf) is never drawn."""
    logits = shaped_logits(np.random.default_rng(vocab), 8, vocab, shape)
    if shape == "holes":
        logits[:, : min(vocab, 300)] = -np.inf  # the first block, and into the second, empty
        logits[:, -1] = 0.0  # one finite score at least
    logits = logits.astype(np.float32)
    params = [SamplingParams(temperature=t, seed=i) for i, t in enumerate([0.3, 0.7, 1.0, 1.0, 1.5, 4.0, 0.9, 1.2])]
    for got in steps_equal_the_reference(logits, params, 4):
        assert all(np.isfinite(logits[i, t]) for i, t in enumerate(got))


def test_the_unranked_draw_at_the_top_of_the_mass_takes_a_token_of_positive_probability():
    """A draw of the largest float under 1 lands at the end of the mass, where the blocks' pairwise
    sums and a block's running sum may disagree in the last bit: the token is the last one of
    positive probability, never a zero-probability token after it."""

    class Top:
        def random(self) -> float:
            return float(np.nextafter(1.0, 0.0))

    data = np.random.default_rng(7)
    for vocab in (300, 5_000, 50_257):
        for _ in range(20):
            e = data.random(vocab) * (data.random(vocab) < 0.3)
            e[-data.integers(1, 200) :] = 0.0  # the mass ends inside the last block(s)
            last = int(np.flatnonzero(e)[-1])
            assert _draw_unranked(e, cast(np.random.Generator, Top())) == last


@pytest.mark.parametrize("vocab", [300, 5_000, 50_257])
@pytest.mark.parametrize("shape", ["peaked", "flat", "tied", "holes"])
def test_top_k_at_real_vocabulary_sizes_equals_ranking_the_whole_vocabulary(vocab, shape):
    """top-k takes the tokens scoring at least the k-th best, found among the few above a bound
    from block maxima (or the whole row where k passes the number of blocks), and keeps the first k
    of the stable ranking: the reference's ranking of the whole vocabulary, ties included."""
    logits = shaped_logits(np.random.default_rng(vocab + 1), 8, vocab, shape, holes=0.7).astype(np.float32)
    ks = [1, 2, 40, 50, 196, 197, 1_000, vocab - 1]
    params = [SamplingParams(temperature=0.8, top_k=k, top_p=0.9 if i % 2 else 1.0, seed=i) for i, k in enumerate(ks)]
    steps_equal_the_reference(logits, params, 3)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2_000), st.integers(0, 2**32), st.sampled_from(["normal", "tied", "holes"]))
def test_top_candidates_are_every_token_at_least_the_m_th_best(vocab, seed, shape):
    data = np.random.default_rng(seed)
    s = data.normal(0, 3, size=vocab)
    if shape == "tied":
        s = np.round(s)
    if shape == "holes":
        s[data.random(vocab) < 0.8] = -np.inf
    m = int(data.integers(1, vocab + 1))
    floor = np.sort(s)[::-1][m - 1]
    np.testing.assert_array_equal(_top_candidates(s, m), np.flatnonzero(s >= floor))


@pytest.mark.parametrize("vocab", [5_000, 50_257])
def test_min_p_rows_equal_the_reference_on_the_cut_scores(vocab):
    """A min_p row's cut tokens become -inf and only its finite scores go through exp: its tokens
    are the reference's on the logits cut by hand (the same float64 comparison after temperature),
    beside rows without min_p in the same batch."""
    data = np.random.default_rng(vocab + 2)
    logits = data.normal(0, 3, size=(6, vocab)).astype(np.float32)
    params = [
        SamplingParams(temperature=t, min_p=q, seed=i)
        for i, (t, q) in enumerate([(0.8, 0.05), (1.0, 0.0), (1.3, 0.2), (0.5, 0.01), (1.0, 0.5), (0.9, 0.0)])
    ]
    rows = [Row(p, NO_SEEN, make_rng(p.seed)) for p in params]
    expected_rngs = [make_rng(p.seed) for p in params]
    for _ in range(3):
        expected = []
        for row, p, rng in zip(logits, params, expected_rngs, strict=True):
            scaled = row.astype(np.float64) / p.temperature
            cut = row.copy()
            if p.min_p > 0:
                cut[scaled < scaled.max() + np.log(p.min_p)] = -np.inf
            expected.append(reference_token(cut, SamplingParams(temperature=p.temperature, seed=p.seed), NO_SEEN, rng))
        assert choose_tokens(logits, rows) == expected


@pytest.mark.parametrize("top_k", [1, 3, 300])
def test_top_k_ranks_nan_scores_last(top_k):
    """A graph that outputs NaN for some tokens: top-k ranks them last (as a stable ranking of the
    whole row does) and draws among the rest, never raising."""
    logits = np.random.default_rng(3).normal(0, 1, size=5_000).astype(np.float32)
    logits[::7] = np.nan
    rng = make_rng(1)
    for _ in range(20):
        token = one(logits, SamplingParams(temperature=1.0, top_k=top_k, seed=1), rng=rng)
        assert isinstance(token, int) and not np.isnan(logits[token])


def test_the_unranked_draw_follows_the_softmax():
    """Without top-k and top-p a row draws in token-id order: over 40,000 seeded rows the
    frequencies are the softmax's within 4.5 standard deviations."""
    logits = np.log(np.asarray([0.4, 0.05, 0.25, 0.0, 0.2, 0.1]) + 1e-30).astype(np.float32)
    n = 40_000
    rows = [Row(SamplingParams(temperature=1.0, seed=i), NO_SEEN, make_rng(i)) for i in range(n)]
    counts = np.bincount(choose_tokens(np.tile(logits, (n, 1)), rows), minlength=6)
    p = np.exp(logits.astype(np.float64)) / np.exp(logits.astype(np.float64)).sum()
    assert counts[3] == 0  # probability ~1e-30: never drawn
    assert np.all(np.abs(counts - n * p) <= 4.5 * np.sqrt(n * p * (1 - p)) + 1)
