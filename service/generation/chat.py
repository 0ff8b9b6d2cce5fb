"""Chat in the generation core: messages -> the model's chat template -> token ids -> generations.

`ChatCore.chat(query)` checks the messages (roles, content as text or text parts, a tool message's
`tool_call_id`, an assistant's `tool_calls` with JSON arguments), renders them with the model's
template (service/generation/chat_template.py), tokenizes the prompt without adding special
tokens (the template writes its own BOS: no double BOS) and admits it as one generation of `n`
choices (`GenerationCore.generate`, choice j with seed + j). A model without a template is
FAILED_PRECONDITION saying how to give it one. Doors turn the choices' chunks into their replies
(service/http/chat.py, service/grpc/chat.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from service import tokenizing
from service.errors import FailedPrecondition, InvalidArgument, label_model
from service.generation import reasoning, tools
from service.generation.chat_template import ChatTemplate
from service.generation.constraint import Structure
from service.generation.core import GenerateQuery, Generation, GenerationCore
from service.generation.decoding import SamplingParams
from service.generation.query import MAX_N

if TYPE_CHECKING:
    from service.generation.model import GenerationModel

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatQuery:
    messages: list[dict[str, Any]]  # OpenAI's shape: role, content (text or parts), name, tool_calls, tool_call_id
    params: SamplingParams
    model: str = ""
    n: int = 1
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs: enable_thinking, ...
    structure: Structure | None = None  # structured output (constraint.py)


@dataclass(frozen=True)
class Chat:
    """An admitted chat: the prompt as rendered and its ids, and its generation of n choices."""

    model: str
    prompt: str
    prompt_ids: list[int]
    generation: Generation
    template: str  # the template's source that rendered the prompt (reasoning.py reads its tags)
    tool_parser: str | None  # the format tool calls are parsed in (settings tool_parser, else the template's)

    def splitter(self) -> reasoning.Splitter:
        """A choice's reasoning / content splitter (service/generation/reasoning.py)."""
        return reasoning.Splitter(self.template, self.prompt)

    def cancel(self) -> None:
        self.generation.cancel()


class ChatCore:
    def __init__(self, core: GenerationCore):
        self.core = core

    def model(self, name: str) -> GenerationModel:
        """The generation model a chat names; UNAVAILABLE while draining, before any rendering."""
        self.core.registry.admit()
        model = cast("GenerationModel", self.core.registry.get("generation", name))
        label_model(model.name)
        return model

    async def render(self, query: ChatQuery) -> tuple[GenerationModel, str, list[int]]:
        """(model, prompt text, prompt ids): the messages checked, rendered and tokenized."""
        model, text, ids, _ = await self._render(query)
        return model, text, ids

    async def _render(self, query: ChatQuery) -> tuple[GenerationModel, str, list[int], str]:
        model = self.model(query.model)
        template = template_of(model)
        messages = [checked_message(m, i) for i, m in enumerate(query.messages)] if query.messages else []
        if not messages:
            raise InvalidArgument("messages is empty; send at least one message")
        text = template.render(
            messages,
            tools=query.tools,
            documents=query.documents,
            add_generation_prompt=query.add_generation_prompt,
            continue_final_message=query.continue_final_message,
            kwargs=query.template_kwargs,
        )
        tokenizing.check_chars(
            text, model.max_prompt_chars, "the rendered chat", model.name, model.max_prompt, "send fewer messages"
        )
        (encoding,) = await model.text_encoder.encode([text], add_special_tokens=False)
        return model, text, list(encoding.ids), template.pick(query.tools)

    async def constrained(self, queries: list[GenerateQuery], structure: Structure | None) -> list[GenerateQuery]:
        """A completion call's queries (one model) with their structure compiled once for every
        choice (each row copies it); as they were without one."""
        if structure is None:
            return queries
        compiled = await self.model(queries[0].model).constraints.compile(structure)
        return [dataclasses.replace(q, params=dataclasses.replace(q.params, constraint=compiled)) for q in queries]

    async def chat(self, query: ChatQuery, deadline: float | None = None) -> Chat:
        """Renders and admits the query's n choices (refusals raise here, before any reply)."""
        if not 1 <= query.n <= MAX_N:  # before rendering
            raise InvalidArgument(f"n must be in [1, {MAX_N}] (choices per prompt), got {query.n}")
        # A full queue refuses before any rendering or tokenizing (generate takes the places after).
        self.model(query.model).scheduler.admission.check(query.n)
        model, text, ids, source = await self._render(query)
        params = query.params
        if query.structure is not None:
            params = dataclasses.replace(params, constraint=await model.constraints.compile(query.structure))
        generation = await self.core.generate(GenerateQuery(ids, params, model.name, n=query.n), deadline)
        return Chat(model.name, text, ids, generation, source, model.tool_parser or tools.parser_of(source))


def template_of(model: GenerationModel) -> ChatTemplate:
    template = model.chat_template
    if template is None:
        raise FailedPrecondition(
            f"model {model.name!r} has no chat template, so messages cannot become its prompt: convert it "
            "with `python -m export convert --chat-template FILE`, start the server with "
            f"--chat-template {model.name}=FILE, or send the text to /v1/completions"
        )
    return template


def checked_message(message: Any, i: int) -> dict[str, Any]:
    """messages[i] checked and made ready for a template: text parts joined into one text, tool
    call arguments parsed from their JSON string (templates write them with tojson)."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise InvalidArgument(f"{where} must be an object with a role and content")
    role = message.get("role")
    if role not in ROLES:
        raise InvalidArgument(f"{where}.role must be one of {', '.join(ROLES)} (got {str(role)[:32]!r})")
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = _content(message.get("content"), where, allow_none=role == "assistant")
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise InvalidArgument(f"{where}: a tool message needs tool_call_id (the id of the call it answers)")
    if "name" in out and not isinstance(out["name"], str):
        raise InvalidArgument(f"{where}.name must be a string")
    if message.get("tool_calls") is not None:
        if role != "assistant":
            raise InvalidArgument(f"{where}: only an assistant message has tool_calls")
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(message["tool_calls"])]
    return out


def _content(value: Any, where: str, allow_none: bool) -> str:
    if value is None and allow_none:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidArgument(
                    f"{where}.content[{j}] must be a text part {{'type': 'text', 'text': ...}} "
                    "(this server takes text only)"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidArgument(f"{where}.content must be a string or an array of text parts")


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidArgument(f"{where} must be {{'type': 'function', 'id', 'function': {{'name', 'arguments'}}}}")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as e:
            raise InvalidArgument(f"{where}.function.arguments is not JSON ({e})") from e
    return {**call, "function": {**function, "arguments": arguments}}
