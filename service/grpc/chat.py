"""Protobuf <-> plain values for GenerationService's Chat and ChatStream (service/generation/chat.py);
the servicer's methods are in service/grpc/generation.py.

JSON-valued fields (`tools_json`, `chat_template_kwargs_json`, a tool call's `arguments`) are parsed
here; a malformed one is INVALID_ARGUMENT naming the field. The messages become the dicts the
chat core checks, in OpenAI's shape, so every door refuses the same messages the same way.
"""

from __future__ import annotations

import json
from typing import Any

from service.errors import InvalidArgument
from service.generation import reasoning, tools
from service.generation.chat import Chat, ChatQuery
from service.generation.output import Chunk
from service.grpc.converters import FINISH_REASONS, sampling_params, usage
from service.proto import inference_pb2 as pb


def _json(text: str, name: str, kind: type) -> Any:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(f"{name} is not JSON ({e})") from e
    if not isinstance(value, kind):
        raise InvalidArgument(f"{name} must be a JSON {'array' if kind is list else 'object'}")
    return value


def _message(m: pb.ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    for name in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, name):
            out[name] = getattr(m, name)
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
            for c in m.tool_calls
        ]
    return out


def structure_fields(request: pb.ChatRequest | pb.GenerateRequest) -> dict[str, Any]:
    """response_format_json and structured_outputs_json (ChatRequest's and GenerateRequest's) as the
    HTTP door's body fields, for constraint.structure_of."""
    return {
        "response_format": _json(request.response_format_json, "response_format_json", dict),
        "structured_outputs": _json(request.structured_outputs_json, "structured_outputs_json", dict),
    }


def chat_query(request: pb.ChatRequest) -> tuple[ChatQuery, tools.ToolChoice]:
    """A ChatRequest as the chat core's query and its tool choice (ranges are checked by the core and
    the model; the JSON fields as the HTTP door checks them)."""
    params = sampling_params(request)  # the same sampling fields as GenerateRequest
    listed = _json(request.tools_json, "tools_json", list)
    body = {
        **structure_fields(request),
        "tool_choice": _any_json(request.tool_choice_json, "tool_choice_json"),
        "parallel_tool_calls": request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True,
    }
    choice, structure = tools.constraint_of(body, listed)
    query = ChatQuery(
        messages=[_message(m) for m in request.messages],
        params=params,
        model=request.model,
        n=int(request.n) or 1,
        tools=listed,
        add_generation_prompt=not request.continue_final_message,
        continue_final_message=request.continue_final_message,
        template_kwargs=_json(request.chat_template_kwargs_json, "chat_template_kwargs_json", dict) or {},
        structure=structure,
    )
    return query, choice


def _any_json(text: str, name: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError as e:
        raise InvalidArgument(f"{name} is not JSON ({e})") from e


def chat_response(choices: list[Chunk], chat: Chat, choice: tools.ToolChoice) -> pb.ChatResponse:
    """Every choice (one joined chunk each), reasoning apart; usage: the prompt once, every choice's output."""
    out = pb.ChatResponse(model=chat.model)
    for j, chunk in enumerate(choices):
        reason, _ = chunk.ending()
        thought, said = reasoning.split(chat.template, chat.prompt, chunk.text)
        content, calls = tools.parse(choice, chat.tool_parser, said)
        out.choices.append(
            pb.ChatChoice(
                index=j,
                content=content or "",
                tool_calls=[
                    pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                    for c in calls
                ],
                reasoning_content=thought or "",
                token_ids=chunk.token_ids,
                finish_reason=FINISH_REASONS[reason],
            )
        )
    first = choices[0]
    out.usage.CopyFrom(usage(first.input_tokens, sum(c.output_tokens for c in choices), first.cached_tokens))
    return out


def whole_chunk(response: pb.ChatResponse) -> pb.ChatChunk:
    """A stream's one chunk when tools are parsed: the reply's single choice, with its usage."""
    (choice,) = response.choices
    return pb.ChatChunk(
        content=choice.content,
        reasoning_content=choice.reasoning_content,
        token_ids=choice.token_ids,
        finish_reason=choice.finish_reason,
        usage=response.usage,
        model=response.model,
        tool_calls=choice.tool_calls,
    )


def chat_chunk(chunk: Chunk, splitter: reasoning.Splitter, model: str) -> pb.ChatChunk:
    thought, said = splitter.feed(chunk.text)
    if chunk.finish_reason is not None:
        held = splitter.finish()
        thought, said = thought + held[0], said + held[1]
    msg = pb.ChatChunk(content=said, reasoning_content=thought, token_ids=chunk.token_ids, model=model)
    if chunk.finish_reason is not None:
        reason, _ = chunk.ending()
        msg.finish_reason = FINISH_REASONS[reason]
        msg.usage.CopyFrom(usage(chunk.input_tokens, chunk.output_tokens, chunk.cached_tokens))
    return msg
