"""Tokenizing texts and (text, text pair) inputs for a classification model, from its tokenizer.json.

A pair is one input: `[CLS] query [SEP] document [SEP]` with token type ids 0 then 1 (BERT), as the
folder's tokenizer writes it. No padding (the engine pads each batch); with truncate, an input over
the manifest's `max_input_tokens` is cut longest-first (the longer text loses a token at a time),
as transformers' `truncation=True` does; without, it is refused naming the input, its length and the
limit. A call of few characters tokenizes on the event loop; larger ones in a thread (encode_batch
releases the GIL), huge ones one at a time (service/tokenizing.py's rules).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tokenizers import Encoding

from service import tokenizing
from service.engine.tokenization import Encoded
from service.errors import InvalidArgument

Input = tuple[str, str | None]  # a text, or a text and its pair (a query and a document)


class PairTokenizer:
    def __init__(self, path: str | Path, max_tokens: int):
        self.max_tokens = max_tokens
        self._truncating = tokenizing.load(path)
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_tokens, strategy="longest_first")
        self._full = tokenizing.load(path)
        self._full.no_padding()
        self._full.no_truncation()
        self.max_chars = tokenizing.max_chars(max_tokens, tokenizing.chars_per_token(self._full))
        self._huge = asyncio.Lock()

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
        tokenizer = self._truncating if truncate else self._full
        return self._checked([tokenizer.encode(t, p) for t, p in inputs], truncate, "inputs")

    async def encode_async(self, inputs: list[Input], truncate: bool, what: str) -> list[Encoded]:
        tokenizer = self._truncating if truncate else self._full
        chars = sum(len(t) + len(p or "") for t, p in inputs)
        if chars <= tokenizing.INLINE_CHARS:
            encodings = [tokenizer.encode(t, p) for t, p in inputs]
        elif chars < tokenizing.HUGE_CHARS:
            encodings = await asyncio.to_thread(tokenizer.encode_batch, [_item(x) for x in inputs])
        else:
            async with self._huge:
                encodings = await asyncio.to_thread(tokenizer.encode_batch, [_item(x) for x in inputs])
        return self._checked(encodings, truncate, what)

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
