"""vLLM's tokenizer routes over a generation model's tokenizer: `POST /tokenize`, `POST /detokenize`,
`GET /tokenizer_info`, in vLLM's request and response shapes (lm-eval's remote tokenizer reads them).

    POST /tokenize      {"prompt", "add_special_tokens": true, "return_token_strs": false, "model"}
                        -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize    {"tokens", "model"} -> {"prompt"}
    GET  /tokenizer_info[?model=NAME] -> the tokenizer's settings (special tokens, lengths)

`model` absent: the default generation model. Chat `messages` are refused: the generators here are
plain language models without a chat template. A prompt is at most TOKENIZE_MAX_CHARS characters
(service/generation/tokens.py) and a reply at most max_message_bytes, else 400.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from service.errors import InvalidArgument
from service.generation.core import GenerationCore
from service.http.schemas import field, refuse_unsupported, text


async def tokenize(core: GenerationCore, body: dict, max_bytes: int) -> JSONResponse:
    model = field(body, "model", str, "")
    if body.get("messages") is not None:
        raise InvalidArgument(
            f"messages: model {core.tokenizer_info(model).model!r} is a plain language model without a "
            "chat template; send a prompt"
        )
    refuse_unsupported(body, {"add_generation_prompt": None, "chat_template": None})
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidArgument("prompt must be a string")
    special = field(body, "add_special_tokens", bool, True)
    strs = field(body, "return_token_strs", bool, False)
    answer = await core.tokenize(text("prompt", prompt), model, special)
    reply = {
        "count": len(answer.ids),
        "max_model_len": answer.context,
        "tokens": answer.ids,
        "token_strs": answer.tokens if strs else None,
    }
    return held(reply, max_bytes)


async def detokenize(core: GenerationCore, body: dict, max_bytes: int) -> JSONResponse:
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise InvalidArgument("tokens must be an array of token ids (integers)")
    answer = await core.detokenize(ids, field(body, "model", str, ""))  # checks each id, off the loop when many
    return held({"prompt": answer.text}, max_bytes)


def held(reply: dict, max_bytes: int) -> JSONResponse:
    """reply as the response (rendered once), unless it is over max_bytes (settings max_message_bytes):
    INVALID_ARGUMENT then."""
    response = JSONResponse(reply)
    size = len(response.body)
    if size > max_bytes:
        raise InvalidArgument(
            f"the response would be {size} bytes, over the server's limit of {max_bytes} "
            "(max_message_bytes): send a shorter text"
        )
    return response


def tokenizer_info(core: GenerationCore, model: str) -> dict:
    """What vLLM's tokenizer_info gives (tokenizer_config.json's fields) that this model has."""
    info = core.tokenizer_info(model)
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
