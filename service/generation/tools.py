"""Tool calls: `tool_choice` as a constraint, and a reply parsed into OpenAI's `tool_calls`.

`tool_choice` "required" and a named function constrain the reply with a JSON schema built from the
tools' parameters (as vLLM does), so even a weak model returns a call that validates: "required"
an array of `{"name", "arguments"}` (one item without `parallel_tool_calls`), a named function its
arguments object. "auto" leaves the reply free and parses it in the format its template's family
uses, picked from the template (or `--tool-parser`): Hermes / Qwen `<tool_call>{...}</tool_call>`,
Llama 3.x JSON `{"name", "parameters"}`, Mistral `[TOOL_CALLS][{...}]`; a reply that does not
parse is content. "none": the tools still reach the template, nothing is parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from service.errors import InvalidArgument
from service.generation.constraint import Structure, structure_of

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # none | auto | required | named
    name: str = ""  # named: the function
    parallel: bool = True


def choice_of(body: dict, tools: list[dict] | None) -> ToolChoice:
    """OpenAI's tool_choice (and parallel_tool_calls), checked against the tools."""
    value, parallel = body.get("tool_choice"), body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidArgument("parallel_tool_calls must be true or false")
    if not tools:
        if value not in (None, "none"):
            raise InvalidArgument("tool_choice needs tools")
        return ToolChoice("none")
    if value is None or value in ("none", "auto", "required"):
        return ToolChoice(value or "auto", parallel=parallel)
    name = value.get("function", {}).get("name") if isinstance(value, dict) else None
    if not isinstance(name, str):
        raise InvalidArgument("tool_choice must be none, auto, required or {'type': 'function', 'function': {'name'}}")
    if name not in {t["function"]["name"] for t in tools}:
        raise InvalidArgument(f"tool_choice names {name[:64]!r}, which is not one of the tools")
    return ToolChoice("named", name, parallel)


def constraint_of(body: dict, tools: list[dict] | None) -> tuple[ToolChoice, Structure | None]:
    """A request's tool choice and the one structure its reply must match (the tool choice's, or
    response_format / structured_outputs'; not both)."""
    choice = choice_of(body, tools)
    given, forced = structure_of(body), structure(choice, tools or [])
    if given is not None and forced is not None:
        raise InvalidArgument(f"tool_choice {choice.mode} constrains the reply itself; leave response_format out")
    return choice, forced or given


def structure(choice: ToolChoice, tools: list[dict]) -> Structure | None:
    """The constraint of required / named (None for auto and none)."""
    params = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}
    if choice.mode == "named":
        return Structure("json_schema", params[choice.name], "tools[].function.parameters")
    if choice.mode != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": schema},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, schema in params.items()
    ]
    array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return Structure("json_schema", array if choice.parallel else {**array, "maxItems": 1}, "tools")


def parser_of(template: str) -> str | None:
    """The tool-call format a template's family writes, from the template's own text."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return None


def parse(choice: ToolChoice, parser: str | None, text: str) -> tuple[str | None, list[dict]]:
    """A reply -> (content or None, OpenAI tool_calls)."""
    if choice.mode in ("named", "required") and not _is_json(text):  # cut by max_tokens: text as it is
        return text, []
    if choice.mode == "named":
        return None, [_call(choice.name, json.loads(text), parser)]
    if choice.mode == "required":
        return None, [_call(i["name"], i["arguments"], parser) for i in json.loads(text)]
    if choice.mode == "none" or parser is None:
        return text, []
    found = PARSERS[parser](text)
    if found is None:
        return text, []
    content, calls = found
    return content or None, [_call(c["name"], c.get("arguments", c.get("parameters", {})), parser) for c in calls]


class CallStream:
    """A streamed reply's tool calls, each given once it is complete where its format closes it
    (Hermes' `</tool_call>` under "auto"; a complete call there is one the whole reply's `parse`
    returns too, in the same place), the rest at the end: the stream's calls and content add up to
    `parse`'s of the whole reply. Other formats' calls are known only at the reply's end."""

    def __init__(self, choice: ToolChoice, parser: str | None):
        self.choice, self.parser = choice, parser
        self.early = choice.mode == "auto" and parser == "hermes"
        self.text, self.sent = "", 0

    def feed(self, text: str) -> tuple[str | None, list[dict]]:
        """More of the reply's content -> (the content before the calls, with the first call only;
        the calls completed now)."""
        self.text += text
        found = _hermes(self.text) if self.early else None
        if found is None or len(found[1]) == self.sent:
            return None, []
        content, calls = found
        new = [_call(c["name"], c.get("arguments", c.get("parameters", {})), self.parser) for c in calls[self.sent :]]
        first, self.sent = self.sent == 0, len(calls)
        return (content or None) if first else None, new

    def finish(self, text: str = "") -> tuple[str | None, list[dict]]:
        """The reply's end (and its last text) -> (its content unless sent with a call, the calls not sent yet)."""
        self.text += text
        content, calls = parse(self.choice, self.parser, self.text)
        return (None if self.sent else content), calls[self.sent :]


def _hermes(text: str) -> tuple[str, list[dict]] | None:
    calls = [json.loads(m) for m in _HERMES.findall(text) if _is_json(m)]
    good = [c for c in calls if _is_call(c)]
    return (text[: text.find("<tool_call>")].strip(), good) if good else None


def _mistral(text: str) -> tuple[str, list[dict]] | None:
    head, marker, tail = text.partition("[TOOL_CALLS]")
    body = tail if marker else text.strip()
    calls = json.loads(body) if _is_json(body) else None
    if not isinstance(calls, list) or not calls or not all(_is_call(c) for c in calls):
        return None
    return (head.strip() if marker else ""), calls


def _llama3(text: str) -> tuple[str, list[dict]] | None:
    body = text.strip().removeprefix("<|python_tag|>")
    call = json.loads(body) if _is_json(body) else None
    return ("", [call]) if isinstance(call, dict) and _is_call(call) else None


PARSERS = {"hermes": _hermes, "llama3_json": _llama3, "mistral": _mistral}  # settings.TOOL_PARSERS names them


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _is_call(value: Any) -> bool:
    arguments = value.get("arguments", value.get("parameters")) if isinstance(value, dict) else None
    return isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(arguments, dict)


def _call(name: str, arguments: Any, parser: str | None) -> dict:
    """OpenAI's tool call; Mistral's templates take only 9-character alphanumeric ids."""
    call_id = uuid.uuid4().hex[:9] if parser == "mistral" else f"call_{uuid.uuid4().hex[:24]}"
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}
