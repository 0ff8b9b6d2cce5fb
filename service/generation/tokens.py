"""The generation core's tokenizer answers as plain values (`GenerationCore.tokenize`, `detokenize`,
`tokenizer_info`), so a door answers /tokenize without the model's tokenizer; their bounds."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from service import tokenizing

TOKENIZE_MAX_CHARS = tokenizing.HUGE_CHARS  # characters one tokenize call takes (memory: GBs at 15 MB)
INLINE_TOKENS = 4096  # ids detokenized on the event loop; more in a thread


@dataclass(frozen=True)
class TokenizerInfo:
    model: str
    special: dict[str, str]  # "bos" / "eos" / "pad" / "unk" -> the token's text
    adds_bos: bool  # encoding a text with its special tokens puts the start token first
    context: int  # the served context (prompt + output)
    max_prompt: int  # tokens a prompt to continue may hold
    vocab_size: int


@dataclass(frozen=True)
class Tokenized:
    model: str
    ids: list[int]
    tokens: list[str]  # each id's tokenizer string
    context: int  # the served context (vLLM's max_model_len)


@dataclass(frozen=True)
class Detokenized:
    model: str
    text: str


def tokenizer_info(
    model: str, tokenizer: Tokenizer, special_ids: dict, context: int, max_prompt: int, vocab: int
) -> TokenizerInfo:
    """A model's TokenizerInfo (built once, at load)."""
    special = {k: int(v) for k, v in special_ids.items() if k in ("bos", "eos", "pad", "unk")}
    return TokenizerInfo(
        model,
        {k: name for k, v in special.items() if (name := tokenizer.id_to_token(v)) is not None},
        "bos" in special and tokenizer.encode("a").ids[:1] == [special["bos"]],
        context,
        max_prompt,
        vocab,
    )
