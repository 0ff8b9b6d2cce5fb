"""vLLM's tokenizer routes over a generation model's tokenizer: `POST /tokenize`, `POST /detokenize`,
`GET /tokenizer_info`, in vLLM's request and response shapes (lm-eval's remote tokenizer reads them).

    POST /tokenize      {"prompt", "add_special_tokens": true, "return_token_strs": false, "model"}
                        -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize    {"tokens", "model"} -> {"prompt"}
    GET  /tokenizer_info[?model=NAME] -> the tokenizer's settings (special tokens, lengths)

`model` absent: the default generation model. `/tokenize` takes chat `messages` instead of a prompt, as
vLLM's does (with `add_generation_prompt`, `continue_final_message`, `tools`, `chat_template_kwargs`):
the prompt the model's chat template renders, tokenized as /v1/chat/completions tokenizes it. A prompt
is at most TOKENIZE_MAX_CHARS characters (service/generation/tokens.py) and a reply at most
max_message_bytes, else 400.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from service.errors import InvalidArgument
from service.generation.chat import ChatCore, ChatQuery
from service.generation.chat_template import DEFAULT
from service.generation.core import GenerationCore, Tokenized
from service.generation.decoding import SamplingParams
from service.http import chat as chat_request
from service.http.schemas import field, refuse_unsupported, text


async def tokenize(core: GenerationCore, body: dict, max_bytes: int) -> JSONResponse:
    model = field(body, "model", str, "")
    refuse_unsupported(body, {"chat_template": None})
    strs = field(body, "return_token_strs", bool, False)
    if body.get("messages") is not None:
        answer = await _chat_tokens(core, body, model)
    else:
        refuse_unsupported(body, {"add_generation_prompt": None})
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidArgument("prompt (a string) or messages (a chat) is required")
        special = field(body, "add_special_tokens", bool, True)
        answer = await core.tokenize(text("prompt", prompt), model, special)
    reply = {
        "count": len(answer.ids),
        "max_model_len": answer.context,
        "tokens": answer.ids,
        "token_strs": answer.tokens if strs else None,
    }
    return held(reply, max_bytes)


async def _chat_tokens(core: GenerationCore, body: dict, model: str) -> Tokenized:
    """The chat's prompt ids as /v1/chat/completions renders and tokenizes them."""
    if field(body, "add_special_tokens", bool, False):
        raise InvalidArgument("add_special_tokens: a chat's template writes its special tokens; leave it false")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise InvalidArgument("messages must be an array of messages ({'role', 'content'})")
    query = ChatQuery(
        messages=messages,
        params=SamplingParams(),
        model=model,
        tools=chat_request.tools_of(body),
        add_generation_prompt=field(body, "add_generation_prompt", bool, True),
        continue_final_message=field(body, "continue_final_message", bool, False),
        template_kwargs=chat_request.kwargs_of(body),
    )
    backend, _, ids = await ChatCore(core).render(query)
    return Tokenized(backend.name, ids, [backend.tokenizer.id_to_token(i) or "" for i in ids], backend.context)


async def detokenize(core: GenerationCore, body: dict, max_bytes: int) -> JSONResponse:
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise InvalidArgument("tokens must be an array of token ids (integers)")
    answer = await core.detokenize(ids, field(body, "model", str, ""))  # checks each id, off the loop when many
    return held({"prompt": answer.text}, max_bytes)


def _template(core: GenerationCore, model: str) -> str | None:
    template = ChatCore(core).model(model).chat_template
    return template.templates.get(DEFAULT) if template is not None else None


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
        "chat_template": _template(core, info.model),
    }
