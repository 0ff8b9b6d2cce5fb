"""A checkpoint's chat template: messages -> the prompt text, rendered as transformers renders it.

The template is Jinja, run in transformers' own environment (its `apply_chat_template`): an
immutable sandbox, `trim_blocks`, `lstrip_blocks`, loop controls, `tojson` without ASCII escaping,
`raise_exception`, `strftime_now`, a sandboxed `dict` and `namespace`; the variables are the
special tokens (`bos_token`, `eos_token`, ...), `messages`, `tools`, `documents`,
`add_generation_prompt` and the request's `chat_template_kwargs` (`enable_thinking`, ...). The
rendered prompt is tokenized without adding special tokens (a template that wants a BOS writes
it): no double BOS. A model directory's templates come from its manifest (`chat_template`:
export/convert/chat_template.py writes them); settings `chat_template` (MODEL=FILE) gives one to a
model without one or overrides it. docs/chat.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from service.errors import InvalidArgument
from service.manifest import ModelDir, ModelDirError, inside

DEFAULT = "default"
TOOL_USE = "tool_use"
RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' aliases, first is the standard
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker for where the final message ends


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in a template, without attribute access to the type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing underscore names (no way to CPython's internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` block (it marks assistant tokens for training): rendered as is."""

    tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension declares it so)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


@lru_cache(maxsize=32)
def compiled(source: str) -> jinja2.Template:
    """The template compiled once per text (InvalidArgument naming the line when it does not parse)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise InvalidArgument(f"the chat template does not parse (line {e.lineno}: {e.message})") from e


@dataclass(frozen=True)
class ChatTemplate:
    """A model's templates by name (`default`, `tool_use`, ...), the special tokens they see, and
    where they came from (the checkpoint's file, or an override's path)."""

    templates: dict[str, str]
    special_tokens: dict[str, str]  # bos_token, eos_token, ... -> the token's text
    source: str

    def pick(self, tools: list | None) -> str:
        """As transformers' get_chat_template: `tool_use` when tools are given and there is one."""
        if tools is not None and TOOL_USE in self.templates:
            return self.templates[TOOL_USE]
        if DEFAULT in self.templates:
            return self.templates[DEFAULT]
        raise InvalidArgument(f"the model's chat templates ({', '.join(sorted(self.templates))}) name none 'default'")

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text; a template that raises (raise_exception, a type error, the sandbox) is
        InvalidArgument with its own message."""
        kwargs = dict(kwargs or {})
        clash = RESERVED & set(kwargs)
        if clash:
            raise InvalidArgument(f"chat_template_kwargs may not set {', '.join(sorted(clash))}")
        if continue_final_message and add_generation_prompt:
            raise InvalidArgument("continue_final_message and add_generation_prompt cannot both be true")
        source = self.pick(tools)
        chat = [_aliased({k: v for k, v in m.items() if v is not None}) for m in messages]
        final = _tag_final(chat, source) if continue_final_message else None
        try:
            text = compiled(source).render(
                messages=chat,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **kwargs},
            )
        except jinja2.exceptions.TemplateError as e:
            raise InvalidArgument(f"the chat template refused the messages: {e.message or e}") from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
            raise InvalidArgument(f"the chat template failed on the messages ({type(e).__name__}: {e})") from e
        return text if final is None else _cut_at_tag(text, final)


def _aliased(message: dict) -> dict:
    """reasoning under any of its names -> `reasoning_content` and `thinking` too (transformers' aliasing)."""
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _tag_final(chat: list[dict], source: str) -> str:
    """Marks the end of the final message's text (transformers' continue_final_message); -> its text."""
    if not chat or not isinstance(chat[-1].get("content"), (str, list)):
        raise InvalidArgument("continue_final_message needs a final message with content to continue")
    if "content" not in source:
        raise InvalidArgument("continue_final_message: the chat template does not read a message's content")
    last = chat[-1]
    if isinstance(last["content"], str):
        final = last["content"]
        last["content"] = final + _CONTINUE_TAG
        return final
    parts = [dict(p) for p in last["content"]]
    for part in reversed(parts):
        if "text" in part:
            final, part["text"] = part["text"], part["text"] + _CONTINUE_TAG
            last["content"] = parts
            return final
    raise InvalidArgument("continue_final_message: the final message has no text part to continue")


def _cut_at_tag(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise InvalidArgument("continue_final_message: the chat template leaves out part of the final message")
    at = text.rindex(tag)
    return text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


def from_model_dir(model_dir: ModelDir) -> ChatTemplate | None:
    """The manifest's templates (files checked against their sha256 by load_model_dir), or None."""
    entry = model_dir.manifest.chat_template
    if not entry:
        return None
    templates = {
        name: inside(model_dir.path, spec["file"], model_dir.path).read_text(encoding="utf-8")
        for name, spec in entry["templates"].items()
    }
    return ChatTemplate(templates, dict(entry.get("special_tokens", {})), str(entry.get("source", "")))


def from_file(path: str | Path, special_tokens: dict[str, str]) -> ChatTemplate:
    """An override: one template file (Jinja) for the model; ModelDirError when unreadable or invalid."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelDirError(f"chat template {path}: unreadable ({e})") from e
    try:
        compiled(text)
    except InvalidArgument as e:
        raise ModelDirError(f"chat template {path}: {e.message}") from e
    return ChatTemplate({DEFAULT: text}, special_tokens, str(path))


def for_model(model_dir: ModelDir, files: dict[str, str], tokenizer) -> ChatTemplate | None:
    """The model's template: the override that settings `chat_template` names for it, else its
    directory's (or None). An override keeps the directory's special tokens, or takes the
    manifest's (bos, eos, unk, pad) as the tokenizer spells them."""
    stored = from_model_dir(model_dir)
    file = files.get(model_dir.manifest.name)
    if file is None:
        return stored
    if stored is not None:
        return from_file(file, stored.special_tokens)
    ids = model_dir.manifest.special_tokens
    special = {f"{k}_token": tokenizer.id_to_token(ids[k]) for k in ("bos", "eos", "unk", "pad") if k in ids}
    return from_file(file, {k: v for k, v in special.items() if v is not None})
