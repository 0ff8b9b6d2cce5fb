"""Embedding tokenization with the `tokenizers` library, from the model directory's tokenizer.json.

The file's own padding / truncation settings are replaced (MiniLM's tokenizer.json pads every
text to 128 tokens: FACTS.md): no padding here (batches are padded per batch by the engine, to
their longest row) and truncation to the manifest's `max_input_tokens`, special tokens included.
With `truncate=False` an input longer than that is refused with InvalidArgument naming the input
index, its token count and the limit, and `too_long_advice` (the fill-mask model, which never
truncates, says so there); one with more characters than the limit can hold is refused so before it
is tokenized, where the tokenizer bounds characters per token (service/tokenizing.py).
`encode_async` tokenizes from the event loop: small calls inline, larger ones in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service import tokenizing
from service.errors import InvalidArgument


@dataclass(frozen=True)
class Encoded:
    """One tokenized input: token ids and token type ids of equal length (special tokens included)."""

    ids: list[int]
    type_ids: list[int]

    def __len__(self) -> int:
        return len(self.ids)


class EmbeddingTokenizer:
    def __init__(
        self,
        path: str | Path,
        max_tokens: int,
        too_long_advice: str = "shorten it or set truncate=true to cut it to the limit",
    ):
        self.max_tokens, self.too_long_advice = max_tokens, too_long_advice
        self._truncating = tokenizing.load(path)
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_tokens)
        self._full = tokenizing.load(path)  # no truncation: measures too-long inputs
        self._full.no_padding()
        self._full.no_truncation()
        self.max_chars = tokenizing.max_chars(max_tokens, tokenizing.chars_per_token(self._full))
        self._encoders = {True: tokenizing.Encoder(self._truncating), False: tokenizing.Encoder(self._full)}

    @property
    def vocab_size(self) -> int:
        return self._full.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: list[str], truncate: bool = True, parallel: bool = True) -> list[Encoded]:
        """Tokenizes texts; raises InvalidArgument when one is too long.

        parallel: encode_batch (the library's thread pool; releases the GIL), for large calls run in
        a thread. Otherwise text by text in the calling thread: on the event loop, encode_batch
        would block the loop until a pool thread is scheduled, a thread hop per call on a busy CPU.
        """
        tokenizer = self._truncating if truncate else self._full
        encodings = tokenizer.encode_batch(texts) if parallel else [tokenizer.encode(t) for t in texts]
        return self._checked(encodings, truncate)

    def check_chars(self, texts: list[str], model: str) -> None:
        """Refuses an input with more characters than max_tokens can hold, before tokenizing it."""
        for i, text in enumerate(texts):
            tokenizing.check_chars(text, self.max_chars, f"inputs[{i}]", model, self.max_tokens, self.too_long_advice)

    async def encode_checked(self, texts: list[str], truncate: bool, model: str) -> list[Encoded]:
        """encode_async, refusing first (without truncation) an input with more characters than the
        limit can hold: what a call's tokenizing is, wherever its queue places are taken."""
        if not truncate:
            self.check_chars(texts, model)
        return await self.encode_async(texts, truncate)

    async def encode_async(self, texts: list[str], truncate: bool = True) -> list[Encoded]:
        """encode from the event loop: inline when small, in a thread when large (tokenizing.Encoder)."""
        return self._checked(await self._encoders[truncate].encode(texts), truncate)

    def _checked(self, encodings, truncate: bool) -> list[Encoded]:
        if not truncate:
            for i, e in enumerate(encodings):
                if len(e.ids) > self.max_tokens:
                    raise InvalidArgument(
                        f"inputs[{i}] is {len(e.ids)} tokens long, over this model's limit of {self.max_tokens}; "
                        + self.too_long_advice
                    )
        return [Encoded(e.ids, e.type_ids) for e in encodings]
