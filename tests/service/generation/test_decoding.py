"""Pure decoding helpers: sampling semantics, parameter ranges, UTF-8-safe detokenising, stop sequences."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from service.generation.decoding import (
    IncrementalDetokenizer,
    ParamError,
    SamplingParams,
    StopMatcher,
    apply_repetition_penalty,
    check_params,
    make_rng,
    next_token,
)

CORPUS = [
    "Once upon a time there was a little cat.",
    "Le chat est très mignon, n'est-ce pas ?",
    "日本語のテキスト 🐱🐶",
]


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    return tok


@pytest.mark.parametrize(
    "params, word",
    [
        (SamplingParams(temperature=-0.5), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(temperature=float("inf")), "temperature"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_p=-0.1), "top_p"),
        (SamplingParams(repetition_penalty=-1.0), "repetition_penalty"),
        (SamplingParams(repetition_penalty=1e-45), "repetition_penalty"),
        (SamplingParams(repetition_penalty=1e9), "repetition_penalty"),
        (SamplingParams(temperature=1e-300), "temperature"),
        (SamplingParams(stop=("",)), "stop[0]"),
        (SamplingParams(stop=("x",) * 17), "stop sequences"),
    ],
)
def test_bad_params_are_refused_with_the_range(params, word):
    with pytest.raises(ParamError, match=word.replace("[", r"\[")):
        check_params(params)


@pytest.mark.parametrize(
    "params",
    [  # the edges of every documented range (docs/api.md) are inside it
        SamplingParams(temperature=0.0, top_p=0.0, repetition_penalty=0.0),
        SamplingParams(temperature=1e-3, top_p=1.0, repetition_penalty=1e-3),
        SamplingParams(temperature=1e3, top_k=1_000_000, repetition_penalty=1e3, seed=2**64 - 1),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.2, stop=("\n",), seed=3),
        SamplingParams(stop=tuple(f"s{i}" for i in range(16))),
        SamplingParams(stop=("x" * 256,)),
    ],
)
def test_params_at_the_edges_of_their_ranges_pass(params):
    assert check_params(params) is None
    logits = np.asarray([1.0, -30.0, 5.0, 30.0, -2.0], np.float32)
    assert next_token(logits, params, np.asarray([1]), make_rng(params.seed)) in range(5)


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
    scores = apply_repetition_penalty(LOGITS, SEEN, penalty).astype(np.float64) / temperature
    assert np.isfinite(scores).all()
    tokens = {next_token(LOGITS, params, SEEN, make_rng(seed)) for seed in range(100)}
    assert tokens == expected


def test_repetition_penalty_follows_hf_semantics():
    logits = np.array([2.0, -2.0, 1.0, -1.0])
    out = apply_repetition_penalty(logits, np.array([0, 1, 1]), 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, -1.0])


def test_greedy_is_argmax_after_the_penalty():
    logits = np.array([0.1, 3.0, 2.0], dtype=np.float32)
    assert next_token(logits, SamplingParams(), np.array([], dtype=np.int64), make_rng(0)) == 1
    penalised = SamplingParams(repetition_penalty=2.0)
    assert next_token(logits, penalised, np.array([1]), make_rng(0)) == 2


def test_top_k_one_is_greedy_and_seed_reproduces():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=100)
    p = SamplingParams(temperature=1.0, top_k=1)
    assert next_token(logits, p, np.array([]), make_rng(None)) == int(np.argmax(logits))
    q = SamplingParams(temperature=1.3, top_p=0.8, seed=7)
    a = [next_token(logits, q, np.array([]), r) for r in [make_rng(7)] for _ in range(20)]
    b = [next_token(logits, q, np.array([]), r) for r in [make_rng(7)] for _ in range(20)]
    assert a == b and len(set(a)) > 1


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = SamplingParams(temperature=1.0, top_p=0.7)
    rng = make_rng(0)
    drawn = {next_token(logits, p, np.array([]), rng) for _ in range(300)}
    assert drawn == {0, 1}


def test_detokenizer_never_breaks_utf8(byte_bpe):
    text = "日本語 🐱 très"
    ids = byte_bpe.encode(text).ids
    detok = IncrementalDetokenizer(byte_bpe, [])
    deltas = [detok.push(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert any(d == "" for d in deltas), "some byte-level token should split a character"


def test_detokenizer_with_prompt_context(byte_bpe):
    prompt = byte_bpe.encode("Once upon").ids
    rest = byte_bpe.encode(" a time").ids
    detok = IncrementalDetokenizer(byte_bpe, prompt)
    assert "".join(detok.push(t) for t in rest) + detok.flush() == " a time"


def test_stop_sequence_across_chunks_is_cut_and_held_back():
    m = StopMatcher(("END", "\n\n"))
    assert m.push("hello E") == "hello "
    assert m.push("N") == ""
    assert m.push("D and more") == ""
    assert m.stopped


def test_stop_prefix_released_when_it_does_not_match():
    m = StopMatcher(("END",))
    assert m.push("EN") == ""
    assert m.push("x") == "ENx"
    assert m.push("E") == ""
    assert m.flush() == "E"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="abAB \n", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    stop=st.text(alphabet="abAB \n", min_size=1, max_size=4),
)
def test_stop_matcher_equals_cutting_the_whole_text(text, cuts, stop):
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    m = StopMatcher((stop,))
    out = "".join(m.push(text[a:b]) for a, b in itertools.pairwise(bounds)) + m.flush()
    i = text.find(stop)
    assert out == (text[:i] if i >= 0 else text)
    assert m.stopped == (i >= 0)
