"""Tokenizers of a model directory: loading one, bounding a text before tokenizing it, and
tokenizing large texts off the event loop. Every model kind uses these three.

- `load(path)`: the `tokenizers.Tokenizer` of a tokenizer.json, or `ModelDirError` naming the file.
- `chars_per_token(tokenizer)`: at most how many characters of input one token stands for, read
  from the tokenizer's pipeline, or None when a stage may drop characters or fold a run into one
  token. A model that refuses inputs over `max_tokens` then refuses a text longer than
  `max_tokens * chars_per_token` characters before tokenizing it (`check_chars`), since
  tokenizing a huge text only to count its tokens costs seconds of CPU and GBs of memory. Why the
  bound holds, and which stages leave none: docs/design/robustness.md.
- `Encoder(tokenizer).encode(texts)`: inline on the event loop for small calls; larger ones in a
  thread with `encode_batch`, which releases the GIL (`encode` does not); huge calls take turns.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tokenizers import Encoding, Tokenizer, pre_tokenizers

from service.errors import InvalidArgument
from service.manifest import ModelDirError

INLINE_CHARS = 4096  # calls up to this many characters tokenize on the event loop (microseconds)
INLINE_TEXTS = 8  # and of at most this many texts: each `encode` costs tens of microseconds on its own
HUGE_CHARS = 1 << 20  # calls from this many characters on tokenize one at a time per Encoder
COMPOSE_SHRINK = 4  # NFC / NFKC: characters one composed character can replace (U+1F82: 4)
_GROWING_NORMALIZERS = {
    "NFD": 1,
    "NFKD": 1,
    "Lowercase": 1,
    "Prepend": 1,
    "NFC": COMPOSE_SHRINK,
    "NFKC": COMPOSE_SHRINK,
}
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split", "Punctuation"}


def load(path: str | Path) -> Tokenizer:
    """The tokenizer of a tokenizer.json; ModelDirError naming the file when it cannot be read."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises plain Exception for a file it cannot parse
        raise ModelDirError(f"{path}: not a tokenizer.json the tokenizers library can read ({e})") from e


def chars_per_token(tokenizer: Tokenizer) -> int | None:
    """At most how many input characters one token stands for; None when this pipeline has no bound."""
    spec = json.loads(tokenizer.to_str())
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None or not _keeps_everything(spec.get("pre_tokenizer")) or not _model_keeps(spec):
        return None
    model = spec["model"]
    vocab = model["vocab"]
    pieces = [p for p, _ in vocab] if model["type"] == "Unigram" else list(vocab)
    added = [t["content"] for t in spec.get("added_tokens") or ()]
    return max(len(p) for p in pieces + added) * shrink


def _shrink(normalizer: dict | None) -> int | None:
    """How many characters at most become one through the normalizer (None: it may drop some)."""
    if normalizer is None:
        return 1
    kind = normalizer["type"]
    if kind == "Sequence":
        factor = 1
        for inner in normalizer["normalizers"]:
            step = _shrink(inner)
            if step is None:
                return None
            factor *= step
        return factor
    if kind == "Replace":
        pattern = normalizer["pattern"].get("String")
        return 1 if pattern is not None and len(normalizer["content"]) >= len(pattern) > 0 else None
    return _GROWING_NORMALIZERS.get(kind)


def _keeps_everything(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    if pre_tokenizer["type"] == "Sequence":
        return all(_keeps_everything(p) for p in pre_tokenizer["pretokenizers"])
    return pre_tokenizer["type"] in _KEEPING_PRE_TOKENIZERS and pre_tokenizer.get("behavior") != "Removed"


def _model_keeps(spec: dict) -> bool:
    """The model gives every (pre-tokenized) character a token of its own or a share of one."""
    model = spec["model"]
    if model.get("byte_fallback"):
        return True
    if model["type"] != "BPE":
        return False
    if model.get("unk_token") is not None:
        return not model.get("fuse_unk")
    return _byte_level(spec.get("pre_tokenizer")) and set(pre_tokenizers.ByteLevel.alphabet()) <= set(model["vocab"])


def _byte_level(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer["type"] == "Sequence":
        return any(_byte_level(p) for p in pre_tokenizer["pretokenizers"])
    return pre_tokenizer["type"] == "ByteLevel"


def max_chars(max_tokens: int, per_token: int | None) -> int | None:
    """The most characters a text of max_tokens tokens can have (None: no bound)."""
    return None if per_token is None else max_tokens * per_token


def check_chars(text: str, limit: int | None, what: str, model: str, max_tokens: int, advice: str) -> None:
    """InvalidArgument when text has more characters than `limit` (max_chars) allows: too many tokens
    for the model, known without tokenizing it."""
    if limit is not None and len(text) > limit:
        raise InvalidArgument(
            f"{what} is {len(text)} characters, more than {max_tokens} tokens can hold with model "
            f"{model!r}'s tokenizer (at most {limit // max_tokens} characters a token), so it is "
            f"over the model's limit of {max_tokens} tokens; {advice}"
        )


class Encoder:
    """A tokenizer that tokenizes calls from the event loop: small ones inline (few texts, few
    characters), larger ones in a thread running `encode_batch` (the GIL released), so the loop
    stays free to refuse overload at once while admitted calls tokenize, and huge ones (HUGE_CHARS) one at a time:
    a 15 MB text takes GBs while it is tokenized (the models that refuse long inputs refuse such
    a text by `check_chars` first where the tokenizer bounds it; truncating embeddings do not)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._huge = asyncio.Lock()

    async def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
        chars = sum(map(len, texts))
        if chars <= INLINE_CHARS and len(texts) <= INLINE_TEXTS:
            return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]
        if chars < HUGE_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode_batch, texts, add_special_tokens=add_special_tokens)
        async with self._huge:
            return await asyncio.to_thread(self.tokenizer.encode_batch, texts, add_special_tokens=add_special_tokens)
