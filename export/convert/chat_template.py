"""A checkpoint's chat template, read as transformers reads it, checked, and stored in the model directory.

`read(folder, tokenizer, override)`: the template the folder's AutoTokenizer loaded (transformers
looks for `chat_template.jinja` beside the tokenizer first, then `additional_chat_templates/`,
else tokenizer_config.json's `chat_template`: a string, or a list of named ones such as `default`
and `tool_use`), or the `--chat-template FILE` given instead. `check` renders `CONVERSATIONS` with the
service's renderer (service/generation/chat_template.py) and tokenizes them with the model
directory's tokenizer, and compares the ids with transformers' `apply_chat_template(tokenize=True)`
on the same folder: a difference is a ParityError naming the conversation and the first differing
position. `ChatTemplates.stage` writes the files and returns the manifest's `chat_template` entry.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from export.convert.errors import ConversionError
from export.convert.folder import HFFolder
from export.gate import parity
from service.generation import chat_template as renderer
from service.manifest import sha256_file

FILE = "chat_template.jinja"  # the default template's file; others: chat_template.<name>.jinja
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city today.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
CALL = {"id": "call0abcd", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
CONVERSATIONS: list[tuple[str, list[dict], list[dict] | None]] = [
    ("one user message", [{"role": "user", "content": "Hello!"}], None),
    (
        "system and several turns",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
        ],
        None,
    ),
    ("non-ASCII text", [{"role": "user", "content": "Ça coûte 12,50 € — 東京, Привет 🙂👍🏽"}], None),
    (
        "a tool call and its result",
        [
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call0abcd", "name": "get_weather", "content": '{"temp": 21}'},
        ],
        [WEATHER],
    ),
]


@dataclass(frozen=True)
class ChatTemplates:
    templates: dict[str, str]  # name -> Jinja text
    special_tokens: dict[str, str]  # what transformers passes the template: bos_token, eos_token, ...
    source: str  # the file it came from
    checked: dict[str, int] = field(default_factory=dict)  # check()'s figures

    def renderer(self) -> renderer.ChatTemplate:
        return renderer.ChatTemplate(self.templates, self.special_tokens, self.source)

    def stage(self, staging: Path) -> dict[str, Any]:
        """Writes the templates into the staging folder -> the manifest's `chat_template` entry."""
        files = {}
        for name, text in self.templates.items():
            path = staging / (FILE if name == renderer.DEFAULT else f"chat_template.{name}.jinja")
            path.write_text(text, encoding="utf-8")
            files[name] = {"file": path.name, "sha256": sha256_file(path)}
        return {
            "source": self.source,
            "special_tokens": self.special_tokens,
            "templates": files,
            "checked": self.checked,
        }


def read(folder: HFFolder, tokenizer, override: Path | None) -> ChatTemplates | None:
    """The override's text, else the folder's templates as its AutoTokenizer holds them, or None."""
    special = {k: str(v) for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    if override is not None:
        try:
            text = Path(override).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConversionError(f"--chat-template {override}: unreadable ({e})") from e
        return ChatTemplates({renderer.DEFAULT: text}, special, str(override))
    found = getattr(tokenizer, "chat_template", None)
    if not found:
        return None
    templates = dict(found) if isinstance(found, dict) else {renderer.DEFAULT: found}
    bad = [name for name in templates if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name)]
    if bad:
        raise ConversionError(f"{folder.path}: chat template name {bad[0]!r} is not a plain name")
    return ChatTemplates(templates, special, _source(folder))


def _source(folder: HFFolder) -> str:
    if (folder.path / FILE).is_file():
        return FILE
    if (folder.path / "additional_chat_templates").is_dir():
        return "additional_chat_templates/"
    return "tokenizer_config.json"


def check(folder: HFFolder, templates: ChatTemplates, tokenizer, override: Path | None) -> ChatTemplates:
    """CONVERSATIONS' ids through our renderer and tokenizer vs transformers' apply_chat_template ->
    templates with the figures (`checked`)."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)
    if override is not None:
        reference.chat_template = templates.templates[renderer.DEFAULT]
    ours = templates.renderer()
    same = refused = 0
    for name, messages, tools in CONVERSATIONS:
        expected, why = _reference_ids(reference, messages, tools)
        try:
            text = ours.render(copy.deepcopy(messages), tools=tools, add_generation_prompt=True)
        except renderer.InvalidArgument as e:
            if expected is not None:
                raise parity.ParityError(f"chat template: {name}: transformers renders it, ours refuses: {e}") from e
            refused += 1
            continue
        if expected is None:
            raise parity.ParityError(f"chat template: {name}: transformers refuses it ({why}), ours renders it")
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != expected:
            at = next(
                (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected))
            )
            raise parity.ParityError(
                f"chat template: {name}: prompt ids differ from transformers' apply_chat_template at position "
                f"{at} (ours {got[at : at + 8]}, transformers {expected[at : at + 8]}); rendered: {text!r}"
            )
        same += 1
    checked = {"conversations": len(CONVERSATIONS), "same_ids": same, "refused_by_template": refused}
    return dataclasses.replace(templates, checked=checked)


def _reference_ids(reference, messages: list[dict], tools) -> tuple[list[int] | None, str]:
    try:
        ids = reference.apply_chat_template(
            copy.deepcopy(messages), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    return list(ids), ""
