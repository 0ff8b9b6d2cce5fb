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

import asyncio

from service.errors import InvalidArgument
from service.http.schemas import field, refuse_unsupported, text

SMALL = 4096  # characters tokenized on the event loop; longer texts in a thread


async def tokenize(model, body: dict) -> dict:
    if body.get("messages") is not None:
        raise InvalidArgument(f"messages: model {model.name!r} is a plain language model without a chat template; "
                              "send a prompt")
    refuse_unsupported(body, {"add_generation_prompt": None, "chat_template": None})
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidArgument("prompt must be a string")
    prompt = text("prompt", prompt)
    special = field(body, "add_special_tokens", bool, True)
    strs = field(body, "return_token_strs", bool, False)
    if special:
        (encoding,) = await model.text_encoder.encode([prompt])  # a long text in a thread
    elif len(prompt) <= SMALL:
        encoding = model.tokenizer.encode(prompt, add_special_tokens=False)
    else:
        encoding = await asyncio.to_thread(model.tokenizer.encode, prompt, add_special_tokens=False)
    ids = list(encoding.ids)
    return {"count": len(ids), "max_model_len": model.context, "tokens": ids,
            "token_strs": list(encoding.tokens) if strs else None}


def detokenize(model, body: dict) -> dict:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise InvalidArgument("tokens must be an array of token ids (integers)")
    if tokens:
        model.check_ids(tokens, "tokens")
    return {"prompt": model.tokenizer.decode(tokens)}


def tokenizer_info(model) -> dict:
    """What vLLM's tokenizer_info gives (tokenizer_config.json's fields) that this model has."""
    tok, special = model.tokenizer, model.manifest.special_tokens
    names = {f"{k}_token": tok.id_to_token(int(special[k])) for k in ("bos", "eos", "pad", "unk") if k in special}
    probe = tok.encode("a")
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model": model.name, **names,
            "add_bos_token": "bos" in special and probe.ids[:1] == [int(special["bos"])],
            "model_max_length": model.context, "max_prompt_tokens": model.max_prompt,
            "vocab_size": model.vocab_size, "chat_template": None}
