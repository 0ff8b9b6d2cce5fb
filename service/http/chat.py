"""OpenAI's chat completions over the chat core (service/generation/chat.py): the request's JSON ->
a `ChatQuery`, and the generations' chunks -> a `chat.completion` or a stream of
`chat.completion.chunk` events (the first carries the role, the last the finish reason; with
`stream_options.include_usage` one more with `choices: []` and the usage, as OpenAI sends it).

    {"model", "messages": [{"role", "content", "name", "tool_calls", "tool_call_id"}], "n",
     "max_completion_tokens" | "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty",
     "seed", "stop", "logprobs", "top_logprobs", "stream", "stream_options": {"include_usage"},
     "tools", "tool_choice", "parallel_tool_calls", "response_format", "structured_outputs",
     "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "documents"}

`temperature` defaults to 0 (greedy), as /v1/completions does here. `logprobs` gives OpenAI's
`{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}` per choice. A reasoning
model's `<think>` text is the message's (or delta's) `reasoning_content` (service/generation/reasoning.py);
tool calls are parsed into `tool_calls` (service/generation/tools.py), structures constrain the reply
(service/generation/constraint.py).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from service.errors import InvalidArgument
from service.generation import reasoning, tools
from service.generation.chat import Chat, ChatQuery
from service.generation.core import Chunk
from service.generation.decoding import SamplingParams
from service.generation.query import MAX_N
from service.generation.scoring import MAX_TOP, TokenLogprobs
from service.http.completions import FINISH, usage
from service.http.schemas import FLOAT32, UINT64, field, penalties, refuse_unsupported, strings

UNSUPPORTED = {  # OpenAI fields this server does not implement yet: refused unless neutral
    "audio": None,
    "modalities": ["text"],
    "prediction": None,
    "echo": False,
}


@dataclass(frozen=True)
class ChatRequest:
    query: ChatQuery
    stream: bool
    include_usage: bool
    logprobs: int | None  # alternatives per token; None: no logprobs
    tool_choice: tools.ToolChoice


def parse(body: dict) -> ChatRequest:
    """The request's fields, checked; refusals name the field (InvalidArgument)."""
    refuse_unsupported(body, UNSUPPORTED)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidArgument("messages must be an array of messages ({'role', 'content'})")
    top = field(body, "top_logprobs", int, None, minimum=0, maximum=MAX_TOP)
    logprobs = (top or 0) if field(body, "logprobs", bool, False) else None
    if top and logprobs is None:
        raise InvalidArgument("top_logprobs needs logprobs: true")
    max_tokens = field(body, "max_completion_tokens", int, None, minimum=1)
    if max_tokens is None:
        max_tokens = field(body, "max_tokens", int, 0, minimum=1)
    params = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=field(body, "temperature", float, 0.0, minimum=0, maximum=FLOAT32),
        top_p=field(body, "top_p", float, 0.0, minimum=0, maximum=FLOAT32),
        top_k=field(body, "top_k", int, 0, minimum=0),
        repetition_penalty=field(body, "repetition_penalty", float, 0.0, minimum=0, maximum=FLOAT32),
        stop=tuple(strings(body, "stop", default=[])),
        seed=field(body, "seed", int, minimum=0, maximum=UINT64),
        logprobs=logprobs,
        **penalties(body),
    )
    listed = tools_of(body)
    choice, structure = tools.constraint_of(body, listed)
    query = ChatQuery(
        messages=messages,
        params=params,
        model=field(body, "model", str, ""),
        n=field(body, "n", int, 1, minimum=1, maximum=MAX_N),
        tools=listed,
        documents=_objects(body, "documents"),
        add_generation_prompt=field(body, "add_generation_prompt", bool, True),
        continue_final_message=field(body, "continue_final_message", bool, False),
        template_kwargs=kwargs_of(body),
        structure=structure,
    )
    stream = field(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise InvalidArgument("stream_options is an object, for a streamed request (stream: true)")
    include_usage = field(options or {}, "include_usage", bool, False)
    if stream and query.n > 1:
        raise InvalidArgument("stream is supported for n=1; send the other choices as separate requests")
    return ChatRequest(query, stream, include_usage, logprobs, choice)


def _objects(body: dict, name: str) -> list[dict] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidArgument(f"{name} must be an array of objects")
    return value


def tools_of(body: dict) -> list[dict] | None:
    tools = _objects(body, "tools")
    for i, tool in enumerate(tools or []):
        function = tool.get("function")
        if (
            tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise InvalidArgument(f"tools[{i}] must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}")
        if not isinstance(function.get("parameters", {}), dict):
            raise InvalidArgument(f"tools[{i}].function.parameters must be a JSON schema (an object)")
    return tools


def kwargs_of(body: dict) -> dict[str, Any]:
    value = body.get("chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument("chat_template_kwargs must be an object (such as {'enable_thinking': false})")
    return value


class Completion:
    """The id and timestamp a chat completion's response or stream events share."""

    def __init__(self, model: str):
        self.id, self.created, self.model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def response(self, chat: Chat, chunks: list[Chunk], request: ChatRequest) -> dict:
        """The chat.completion of every choice's joined chunk (chunks[j]: choice j)."""
        choices = []
        for j, chunk in enumerate(chunks):
            thought, said = reasoning.split(chat.template, chat.prompt, chunk.text)
            message, called = _message(thought, said, chat, request.tool_choice)
            reason = "tool_calls" if called else FINISH[chunk.ending()[0]]
            lp = logprobs_object(chunk.logprobs, request.logprobs)
            choices.append({"index": j, "message": message, "logprobs": lp, "finish_reason": reason})
        out = self._envelope("chat.completion", choices)
        first = chunks[0]
        out["usage"] = usage(first.input_tokens, sum(c.output_tokens for c in chunks), first.cached_tokens)
        return out

    def first(self, include_usage: bool) -> dict:
        """The stream's first event: the assistant's role, no text yet."""
        out = self._envelope("chat.completion.chunk", [_delta({"role": "assistant", "content": ""}, None, None)])
        return {**out, "usage": None} if include_usage else out

    def event(self, chunk: Chunk, splitter: reasoning.Splitter, top: int | None, include_usage: bool) -> dict:
        """One stream event: the chunk's text split into reasoning and content (what a tag may still
        begin is held back until the next chunk, or the last)."""
        reason = None if chunk.finish_reason is None else FINISH[chunk.finish_reason]
        thought, said = splitter.feed(chunk.text)
        if reason is not None:
            held = splitter.finish()
            thought, said = thought + held[0], said + held[1]
        delta = {"reasoning_content": thought} if thought else {}
        if said or (not thought and reason is None):
            delta["content"] = said
        out = self._envelope("chat.completion.chunk", [_delta(delta, logprobs_object(chunk.logprobs, top), reason)])
        return {**out, "usage": None} if include_usage else out

    def tool_event(
        self, thought: str, content: str | None, calls: list[dict], first: int, request: ChatRequest
    ) -> dict:
        """A stream event when tools are parsed (tools.CallStream): reasoning as it comes, the calls
        complete so far (indexed from `first`) with the content before them."""
        delta: dict[str, Any] = {"reasoning_content": thought} if thought else {}
        if content is not None:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = [{"index": first + k, **call} for k, call in enumerate(calls)]
        out = self._envelope("chat.completion.chunk", [_delta(delta, None, None)])
        return {**out, "usage": None} if request.include_usage else out

    def last_tool_event(
        self, thought: str, said: str, stream: tools.CallStream, whole: Chunk, request: ChatRequest
    ) -> dict:
        """The last event when tools are parsed: what is left of the reasoning (`thought`) and the
        content (`said`), the content and calls not sent yet, the whole reply's logprobs and the finish reason."""
        sent = stream.sent
        content, calls = stream.finish(said)
        out = self.tool_event(thought, content, calls, sent, request)
        reason = "tool_calls" if sent or calls else FINISH[whole.ending()[0]]
        out["choices"][0].update(logprobs=logprobs_object(whole.logprobs, request.logprobs), finish_reason=reason)
        return out

    def usage_event(self, last: Chunk) -> dict:
        counts = usage(last.input_tokens, last.output_tokens, last.cached_tokens)
        return {**self._envelope("chat.completion.chunk", []), "usage": counts}


def _message(thought: str | None, said: str, chat: Chat, choice: tools.ToolChoice) -> tuple[dict, bool]:
    """(the assistant message, whether it calls tools): content, reasoning_content, tool_calls."""
    content, calls = tools.parse(choice, chat.tool_parser, said)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thought is not None:
        message["reasoning_content"] = thought
    if calls:
        message["tool_calls"] = calls
    return message, bool(calls)


def _delta(delta: dict, logprobs: dict | None, reason: str | None) -> dict:
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}


def logprobs_object(scores: TokenLogprobs | None, top: int | None) -> dict | None:
    """OpenAI's chat logprobs: each token's text, log-probability, UTF-8 bytes and its alternatives."""
    if scores is None or top is None:
        return None
    content = []
    for i, (token, value) in enumerate(zip(scores.tokens, scores.logprobs, strict=True)):
        alternatives = zip(scores.top_tokens[i][:top], scores.top_logprobs[i][:top], strict=False)
        content.append(
            {
                **_token(token, value),
                "top_logprobs": [_token(t, v) for t, v in alternatives],
            }
        )
    return {"content": content}


def _token(token: str, value: float | None) -> dict:
    return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8", "replace"))}
