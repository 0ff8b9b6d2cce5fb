"""service/tokenizing.py: the characters-per-token bound holds for the pipelines it bounds (texts
drawn at random, tokenizers built and trained in code), is None where a stage can drop characters or
fold a run into one token, and large calls tokenize without holding up the event loop."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from service import tokenizing

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "héllo wörld, ça va? 😀 中文 text",
    "numbers 12345 and symbols !?#",
    "aaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbb",
] * 20
ALPHABET = "abcdefghijklmnopqrstuvwxyz     .,!?\n\t0123456789éüç😀中文\u0301\u0300\u0000Ω"


def trained(model, trainer, normalizer=None, pre_tokenizer=None) -> Tokenizer:
    tok = Tokenizer(model)
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def byte_level() -> Tokenizer:
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return trained(models.BPE(), trainer, pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False))


def metaspace_unk() -> Tokenizer:
    return trained(
        models.BPE(unk_token="<unk>"),
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]),
        pre_tokenizer=pre_tokenizers.Metaspace(),
    )


def llama_like() -> Tokenizer:
    tok = trained(
        models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True),
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"] + [f"<0x{b:02X}>" for b in range(256)]),
        normalizer=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
    )
    tok.decoder = decoders.ByteFallback()
    return tok


def nfc_byte_level() -> Tokenizer:
    tok = byte_level()
    tok.normalizer = normalizers.NFC()
    return tok


BOUNDED = {
    "byte-level BPE": byte_level,
    "Metaspace BPE with <unk>": metaspace_unk,
    "byte fallback": llama_like,
    "NFC": nfc_byte_level,
}
UNBOUNDED = {
    "WordPiece": lambda: trained(
        models.WordPiece(unk_token="[UNK]"),
        trainers.WordPieceTrainer(special_tokens=["[UNK]"]),
        normalizers.BertNormalizer(),
        pre_tokenizers.BertPreTokenizer(),
    ),
    "fuse_unk": lambda: trained(
        models.BPE(unk_token="<unk>", fuse_unk=True), trainers.BpeTrainer(special_tokens=["<unk>"])
    ),
    "Unigram": lambda: trained(models.Unigram(), trainers.UnigramTrainer(unk_token="<unk>", special_tokens=["<unk>"])),
    "Strip": lambda: _with(byte_level(), normalizer=normalizers.Strip()),
    "Whitespace": lambda: trained(
        models.BPE(unk_token="<unk>"),
        trainers.BpeTrainer(special_tokens=["<unk>"]),
        pre_tokenizer=pre_tokenizers.Whitespace(),
    ),
    "BPE dropping unknowns": lambda: trained(models.BPE(), trainers.BpeTrainer()),
}


def _with(tok: Tokenizer, **parts) -> Tokenizer:
    for name, value in parts.items():
        setattr(tok, name, value)
    return tok


@pytest.mark.parametrize("name", BOUNDED)
def test_a_text_holds_at_least_its_characters_over_the_bound_in_tokens(name):
    tok = BOUNDED[name]()
    per_token = tokenizing.chars_per_token(tok)
    assert per_token is not None and per_token >= len("<|endoftext|>")
    rng = random.Random(7)
    for _ in range(400):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 300)))
        if rng.random() < 0.2:
            text = rng.choice(["<|endoftext|>", "the quick ", "a" * 24]) * rng.randint(1, 40)
        assert len(tok.encode(text).ids) * per_token >= len(text), (name, text)


@pytest.mark.parametrize("name", UNBOUNDED)
def test_pipelines_that_can_drop_or_fold_characters_have_no_bound(name):
    assert tokenizing.chars_per_token(UNBOUNDED[name]()) is None


def test_too_many_characters_are_refused_saying_why():
    tokenizing.check_chars("x" * 100, tokenizing.max_chars(10, 10), "prompt", "m", 10, "shorten it")
    with pytest.raises(tokenizing.InvalidArgument, match="prompt is 101 characters, more than 10 tokens can hold"):
        tokenizing.check_chars("x" * 101, tokenizing.max_chars(10, 10), "prompt", "m", 10, "shorten it")
    tokenizing.check_chars("x" * 10**6, tokenizing.max_chars(10, None), "prompt", "m", 10, "")  # no bound


async def test_a_large_call_tokenizes_off_the_event_loop():
    encoder = tokenizing.Encoder(byte_level())
    text = "the quick brown fox " * 100_000  # 2 MB: a huge call, in a thread
    lags, done = [], False

    async def tick():
        while not done:
            start = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - start - 0.01)

    ticker = asyncio.create_task(tick())
    (encoding,) = await encoder.encode([text])
    done = True
    await ticker
    assert len(encoding.ids) > 100_000 and len(lags) > 5
    assert max(lags[:-1]) < 1.0  # the last tick may see the encoding freed on the loop
