"""Instruction prompts of a sentence-transformers folder -> the model directory's extra fields.

`config_sentence_transformers.json` may name `prompts` (name -> the text put before each input,
e.g. {"query": "query: "}) and a `default_prompt_name` used when a call names none. They are
stored as the manifest's `extra.prompts` and `extra.default_prompt_name` (docs/model-directory.md);
the service prepends the chosen text to each input before tokenizing, as
`SentenceTransformer.encode(prompt_name=...)` does. Malformed values are refused before any file
is written, naming the file and the field.
"""

from __future__ import annotations

from typing import Any

from export.convert.errors import ConversionError
from export.convert.folder import HFFolder

CONFIG = "config_sentence_transformers.json"


def read(folder: HFFolder) -> dict[str, Any]:
    """{"prompts": {name: text}, "default_prompt_name": name} (each key absent when the folder has none)."""
    config = folder.json(CONFIG) or {}
    where = folder.where(CONFIG)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ConversionError(f"{where}: prompts must map prompt names to prefix texts, not {prompts!r}")
    out: dict[str, Any] = {"prompts": prompts} if prompts else {}
    default = config.get("default_prompt_name")
    if default is not None:
        if default not in prompts:
            raise ConversionError(
                f"{where}: default_prompt_name = {default!r} is not one of its prompts "
                f"({', '.join(map(repr, prompts)) or 'none'})"
            )
        out["default_prompt_name"] = default
    return out
