"""A generation model's tokenizer as the doors need it: text <-> token ids, each token's own text,
the special tokens. `GenerationCore.tokens(model)` hands one out, so a door formats OpenAI's
logprobs and answers /tokenize without reaching into the model.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from service.generation.decoding import IncrementalDetokenizer

INLINE_CHARS = 4096  # texts tokenized on the event loop; longer ones in a thread


@dataclass(frozen=True)
class TokenizerInfo:
    model: str
    special: dict[str, str]  # "bos" / "eos" / "pad" / "unk" -> the token's text
    adds_bos: bool  # encoding a text with its special tokens puts the start token first
    context: int  # the served context (prompt + output)
    max_prompt: int  # tokens a prompt to continue may hold
    vocab_size: int


class Tokens:
    def __init__(self, model):
        self.model = model.name
        self._tok, self._encoder, self._check = model.tokenizer, model.text_encoder, model.check_ids
        special = {k: int(v) for k, v in model.manifest.special_tokens.items() if k in ("bos", "eos", "pad", "unk")}
        self._info = TokenizerInfo(
            model.name,
            {k: self._tok.id_to_token(v) for k, v in special.items()},
            "bos" in special and self._tok.encode("a").ids[:1] == [special["bos"]],
            model.context,
            model.max_prompt,
            model.vocab_size,
        )

    def info(self) -> TokenizerInfo:
        return self._info

    async def encode(self, text: str, special: bool = True) -> tuple[list[int], list[str]]:
        """text -> (token ids, their tokenizer strings); with special, the start token as a prompt gets it."""
        if special:
            (encoding,) = await self._encoder.encode([text])  # a long text in a thread
        elif len(text) <= INLINE_CHARS:
            encoding = self._tok.encode(text, add_special_tokens=False)
        else:
            encoding = await asyncio.to_thread(self._tok.encode, text, add_special_tokens=False)
        return list(encoding.ids), list(encoding.tokens)

    def decode(self, ids: list[int], name: str = "tokens") -> str:
        """ids (checked: InvalidArgument naming `name`) -> their text, special tokens left out."""
        if ids:
            self._check(ids, name)
        return self._tok.decode(ids)

    def texts(self, ids: list[int]) -> list[str]:
        """Each token's own text, special tokens spelled out (how OpenAI shows a token)."""
        return self._tok.decode_batch([[t] for t in ids], skip_special_tokens=False)

    def detokenizer(self, context: list[int]) -> IncrementalDetokenizer:
        """Text deltas of tokens that follow `context` (as generation emits them)."""
        return IncrementalDetokenizer(self._tok, context)
