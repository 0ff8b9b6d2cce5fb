"""vLLM's tokenizer routes over a generation model's tokenizer: `POST /tokenize`, `POST /detokenize`,
`GET /tokenizer_info`, in vLLM's request and response shapes (lm-eval's remote tokenizer reads them).

    POST /tokenize      {"prompt", "add_special_tokens": true, "return_token_strs": false, "model"}
                        -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize    {"tokens", "model"} -> {"prompt"}
    GET  /tokenizer_info[?model=NAME] -> the tokenizer's settings (special tokens, lengths)

`model` absent: the default generation model. Chat `messages` are refused: the generators here are
plain language models without a chat template.
"""

from __future__ import annotations

from service.errors import InvalidArgument
from service.generation.core import Tokens
from service.http.schemas import field, refuse_unsupported, text


async def tokenize(tokens: Tokens, body: dict) -> dict:
    if body.get("messages") is not None:
        raise InvalidArgument(
            f"messages: model {tokens.model!r} is a plain language model without a chat template; send a prompt"
        )
    refuse_unsupported(body, {"add_generation_prompt": None, "chat_template": None})
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidArgument("prompt must be a string")
    ids, strs = await tokens.encode(text("prompt", prompt), field(body, "add_special_tokens", bool, True))
    return {
        "count": len(ids),
        "max_model_len": tokens.info().context,
        "tokens": ids,
        "token_strs": strs if field(body, "return_token_strs", bool, False) else None,
    }


def detokenize(tokens: Tokens, body: dict) -> dict:
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise InvalidArgument("tokens must be an array of token ids (integers)")
    return {"prompt": tokens.decode(ids, "tokens")}


def tokenizer_info(tokens: Tokens) -> dict:
    """What vLLM's tokenizer_info gives (tokenizer_config.json's fields) that this model has."""
    info = tokens.info()
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model": info.model,
        **{f"{k}_token": v for k, v in info.special.items()},
        "add_bos_token": info.adds_bos,
        "model_max_length": info.context,
        "max_prompt_tokens": info.max_prompt,
        "vocab_size": info.vocab_size,
        "chat_template": None,
    }
