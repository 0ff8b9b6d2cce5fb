"""Streaming detokenisation (decoding.IncrementalDetokenizer) against real tokenizers built in code.

Three tokenizers of the kinds served (nothing downloaded): a byte-level BPE (GPT-2's pre-tokenizer
and decoder), and two Llama-style BPEs with byte fallback (`<0xE2>` tokens for what the vocabulary
lacks): Llama 2's (normalizer prepends and replaces spaces by `▁`; decoder Replace, ByteFallback,
Fuse, Strip) and the newer Metaspace one (pre-tokenizer and decoder Metaspace, prepend "first").
The vocabularies hold ASCII and a few accents, so CJK and emoji fall back to bytes, one token each.

Properties, for a prompt and a generation that are encodings of random text (emoji, CJK, accents,
newlines):
(a) no chunk holds U+FFFD (a multi-byte character is never split across chunks);
(b) the chunks joined equal the full decode of prompt + generated ids past the prompt's own text;
(c) a Metaspace `▁Hello` right after the prompt is " Hello", and "Hello" with no prompt.
Arbitrary id sequences (invalid byte runs included) must not fail, and where the full decode is
valid text the chunks equal it too.
"""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from service.generation.decoding import REPLACEMENT_CHAR, IncrementalDetokenizer

CORPUS = [
    "Hello world, the cat sat on the mat.",
    "Once upon a time there was a tiny model.",
    "café naïve résumé über straße déjà vu",
    "Ask me: what is 2 + 2? Four!",
] * 8
ALPHABET = "abcdefghij XYZ.,!?\n" + "éèüñçßà" + "日本語中文字の" + "😀🎉👍🏽🐱€"
TEXT = st.text(alphabet=ALPHABET, max_size=24)
NAMES = ("byte-bpe", "llama2", "metaspace")


@functools.cache
def tokenizer(name: str) -> Tokenizer:
    if name == "byte-bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            CORPUS,
            trainers.BpeTrainer(
                vocab_size=320,
                special_tokens=["<|endoftext|>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False,
            ),
        )
        return tok
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if name == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="first")])
    tok.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    )
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):  # what SentencePiece's byte_fallback vocabularies hold
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    return Tokenizer.from_str(json.dumps(spec))


def stream(tok: Tokenizer, prompt: list[int], generated: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt)
    return [detok.push(t) for t in generated] + [detok.flush()]


def reference(tok: Tokenizer, prompt: list[int], generated: list[int]) -> str:
    """The generated text as the full decode shows it: decode(prompt + generated) past decode(prompt)."""
    before = tok.decode(prompt)
    full = tok.decode(prompt + generated)
    assert full.startswith(before), (before, full)
    return full[len(before) :]


def test_tokenizers_fall_back_to_bytes():
    for name in ("llama2", "metaspace"):
        tokens = tokenizer(name).encode("日本 😀 é").tokens
        assert "<0xF0>" in tokens and "<0xE6>" in tokens, tokens
    assert "<0xF0>" not in tokenizer("byte-bpe").get_vocab()


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=TEXT, text=TEXT.filter(bool), bos=st.booleans(), glued=st.booleans())
def test_streamed_text_equals_the_full_decode(name, prompt, text, bos, glued):
    tok = tokenizer(name)
    prompt_ids = ([tok.token_to_id("<s>")] if bos and name != "byte-bpe" else []) + tok.encode(prompt).ids
    generated = tok.encode(text).ids
    if glued and len(generated) > 1 and tok.id_to_token(generated[0]) == "▁":  # no space after the prompt
        generated = generated[1:]
    chunks = stream(tok, prompt_ids, generated)
    assert not any(REPLACEMENT_CHAR in c for c in chunks), chunks  # (a)
    assert "".join(chunks) == reference(tok, prompt_ids, generated)  # (b)
    if not prompt_ids:  # (the decode itself may drop a leading space a Metaspace tokenizer added: " " -> "")
        assert "".join(chunks) == tok.decode(generated)
        assert text.strip() == "" or "".join(chunks).strip() == text.strip()


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None)
@given(prompt=TEXT, data=st.data())
def test_arbitrary_ids_stream_without_failing(name, prompt, data):
    tok = tokenizer(name)
    prompt_ids = tok.encode(prompt).ids
    generated = data.draw(st.lists(st.integers(0, tok.get_vocab_size() - 1), max_size=24))
    chunks = stream(tok, prompt_ids, generated)
    if REPLACEMENT_CHAR not in tok.decode(prompt_ids + generated):
        assert "".join(chunks) == reference(tok, prompt_ids, generated)


@pytest.mark.parametrize("name", ("llama2", "metaspace"))
def test_metaspace_leading_space_mid_text_and_at_the_start(name):
    tok = tokenizer(name)
    hello = tok.encode("Hello").ids
    assert tok.id_to_token(hello[0]).startswith("▁")
    assert "".join(stream(tok, tok.encode("the cat").ids, hello)) == " Hello"
    assert "".join(stream(tok, [], hello)) == "Hello"
    assert "".join(stream(tok, [tok.token_to_id("<s>")], hello)) == "Hello"
    assert "".join(stream(tok, [], tok.encode("Hello world").ids)) == "Hello world"


@pytest.mark.parametrize("name", NAMES)
def test_a_prompt_ending_in_byte_fallback_characters(name):
    """The prompt's last tokens are decoded with the new ones: a window starting inside a byte run
    (the tail of 本's bytes) must not turn the generated 😀 into U+FFFD."""
    tok = tokenizer(name)
    prompt = tok.encode("a 日本").ids
    generated = tok.encode("😀 ok").ids[1:] if name != "byte-bpe" else tok.encode("😀 ok").ids
    chunks = stream(tok, prompt, generated)
    assert "".join(chunks) == reference(tok, prompt, generated)
    assert REPLACEMENT_CHAR not in "".join(chunks)
