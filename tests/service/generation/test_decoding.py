"""Pure decoding helpers: parameter ranges, UTF-8-safe detokenising, stop sequences (sampling: test_sampler.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from service.generation.decoding import IncrementalDetokenizer, ParamError, SamplingParams, StopMatcher, check_params

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
    [  # the edges of every documented range (docs/api.md) are inside it (test_sampler.py samples them)
        SamplingParams(stop=tuple(f"s{i}" for i in range(16))),
        SamplingParams(stop=("x" * 256,)),
        SamplingParams(logprobs=20, prompt_logprobs=0, score_only=True),
    ],
)
def test_params_at_the_edges_of_their_ranges_pass(params):
    assert check_params(params) is None


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
