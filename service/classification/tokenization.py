"""Tokenizing texts and (text, text pair) inputs for a classification model, from its tokenizer.json.

A pair is one input: `[CLS] query [SEP] document [SEP]` with token type ids 0 then 1 (BERT), as the
folder's tokenizer writes it. No padding (the engine pads each batch). With truncate, an input over
the manifest's `max_input_tokens` is cut as the folder cuts it (extra.truncation): `longest_first`
(the longer text loses a token at a time, transformers' `truncation=True`, CrossEncoder's default)
or `only_second` (the query is kept whole and only the document is cut; a query that leaves the
document no room is refused, naming it); a single text is cut at its end. Without truncate, an
input over the limit is refused naming the input, its length and the limit. A call of few characters
tokenizes on the event loop; larger ones in a thread (encode_batch releases the GIL), huge ones one
at a time (service/tokenizing.py's rules).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from service import tokenizing
from service.engine.tokenization import Encoded
from service.errors import InvalidArgument

Input = tuple[str, str | None]  # a text, or a text and its pair (a query and a document)
STRATEGIES = ("longest_first", "only_second")


class PairTokenizer:
    def __init__(self, path: str | Path, max_tokens: int, strategy: str = "longest_first"):
        if strategy not in STRATEGIES:
            raise ValueError(f"pair truncation {strategy!r} is not one of {', '.join(STRATEGIES)}")
        self.max_tokens, self.strategy = max_tokens, strategy
        self._singles = self._load(path, max_tokens, "longest_first")  # one text: cut at its end
        self._pairs = self._load(path, max_tokens, strategy)
        self._full = self._load(path, None, strategy)
        self.max_chars = tokenizing.max_chars(max_tokens, tokenizing.chars_per_token(self._full))
        self._huge = asyncio.Lock()

    @staticmethod
    def _load(path: str | Path, limit: int | None, strategy: str) -> Tokenizer:
        tokenizer = tokenizing.load(path)
        tokenizer.no_padding()
        tokenizer.no_truncation() if limit is None else tokenizer.enable_truncation(limit, strategy=strategy)
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self._full.get_vocab_size(with_added_tokens=True)

    def check_chars(self, inputs: list[Input], what: str, model: str) -> None:
        """Refuses, before tokenizing, an input whose characters cannot fit max_tokens (truncate=false)."""
        for i, (text, pair) in enumerate(inputs):
            chars = len(text) + len(pair or "")
            if self.max_chars is not None and chars > self.max_chars:
                raise InvalidArgument(
                    f"{what}[{i}] is {chars} characters, more than model {model!r}'s limit of "
                    f"{self.max_tokens} tokens can hold; shorten it or set truncate=true to cut it to the limit"
                )

    def encode(self, inputs: list[Input], truncate: bool = True) -> list[Encoded]:
        """Blocking: tokenizes in the calling thread (warm-up, tests)."""
        return self._checked(self._encode(inputs, truncate, "inputs", batch=False), truncate, "inputs")

    async def encode_async(self, inputs: list[Input], truncate: bool, what: str) -> list[Encoded]:
        chars = sum(len(t) + len(p or "") for t, p in inputs)
        if chars <= tokenizing.INLINE_CHARS:
            encodings = self._encode(inputs, truncate, what, batch=False)
        elif chars < tokenizing.HUGE_CHARS:
            encodings = await asyncio.to_thread(self._encode, inputs, truncate, what, True)
        else:
            async with self._huge:
                encodings = await asyncio.to_thread(self._encode, inputs, truncate, what, True)
        return self._checked(encodings, truncate, what)

    def _encode(self, inputs: list[Input], truncate: bool, what: str, batch: bool) -> list[Encoding]:
        """Singles and pairs, each through its tokenizer (one batch each when batch), in input order."""
        out: list[Encoding | None] = [None] * len(inputs)
        for tokenizer, pairs in ((self._singles, False), (self._pairs, True)):
            chosen = [i for i, (_, pair) in enumerate(inputs) if (pair is not None) == pairs]
            tokenizer = tokenizer if truncate else self._full
            try:
                if batch:
                    encodings = tokenizer.encode_batch([_item(inputs[i]) for i in chosen])
                else:
                    encodings = [tokenizer.encode(*inputs[i]) for i in chosen]
            except Exception as e:  # tokenizers' truncation error: a first text that leaves no room
                raise self._no_room(inputs, chosen, what) from e
            for i, encoding in zip(chosen, encodings, strict=True):
                out[i] = encoding
        return [e for e in out if e is not None]

    def _no_room(self, inputs: list[Input], chosen: list[int], what: str) -> InvalidArgument:
        """The refusal of the first pair whose first text leaves its second no room (only_second)."""
        for i in chosen:
            first = len(self._full.encode(inputs[i][0]).ids)
            try:
                self._pairs.encode(*inputs[i])
            except Exception:
                return InvalidArgument(
                    f"{what}[{i}]: its first text (the query) is {first} tokens as the model reads it, too long "
                    f"to keep whole within this model's limit of {self.max_tokens} with its second text; the "
                    "model cuts only the second text (truncation only_second): shorten the query"
                )
        return InvalidArgument(f"{what}: the tokenizer could not truncate the inputs to {self.max_tokens} tokens")

    def _checked(self, encodings: list[Encoding], truncate: bool, what: str) -> list[Encoded]:
        if not truncate:
            for i, e in enumerate(encodings):
                if len(e.ids) > self.max_tokens:
                    raise InvalidArgument(
                        f"{what}[{i}] is {len(e.ids)} tokens long as the model reads it (special tokens and "
                        f"the pair included), over this model's limit of {self.max_tokens}; "
                        "shorten it or set truncate=true to cut it to the limit"
                    )
        return [Encoded(e.ids, e.type_ids) for e in encodings]


def _item(x: Input) -> str | tuple[str, str]:
    text, pair = x
    return text if pair is None else (text, pair)
