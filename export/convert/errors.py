"""What a converter returns, and the one error it raises for anything it cannot convert."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer
from torch import nn


class ConversionError(ValueError):
    """A folder that cannot be converted: the message names the file, the field and its value, and
    what is supported. Raised before any file is written."""


def refuse(where: str, field_name: str, value: Any, supported) -> ConversionError:
    """-> ConversionError '<where>: <field> = <value> is not supported (supported: ...)'."""
    return ConversionError(
        f"{where}: {field_name} = {value!r} is not supported "
        f"(supported: {', '.join(map(repr, supported)) if supported else 'none'})"
    )


@dataclass
class Converted:
    """A checkpoint mapped onto one of the project's modules, ready for the build (export/build.py)."""

    kind: str  # embedding | fill-mask | generation | translation
    model: nn.Module  # ours, fp32, eval mode
    tokenizer: Tokenizer  # the model directory's tokenizer.json
    special_tokens: dict[str, int]
    max_input_tokens: int
    max_output_tokens: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)  # generation: every end id, special_tokens' eos first
    source: dict[str, Any] = field(default_factory=dict)  # what was read: architecture, model_type, options
    chat_template: Any = None  # generation: export/convert/chat_template.ChatTemplates, or None
    prompts: dict[str, Any] = field(default_factory=dict)  # embedding: export/convert/prompts.py's extra fields
