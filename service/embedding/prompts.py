"""An embedder's instruction prompts: which prefix a call's inputs get before tokenizing.

The model directory's `extra.prompts` ({name: prefix text}) and `extra.default_prompt_name` come
from sentence-transformers' config (export/convert/prompts.py). A call chooses by `prompt_name`
(TEI's field) or gives the `prompt` text itself; neither: the default prompt, if the model has
one. As `SentenceTransformer.encode`, the prefix is joined to each input before tokenizing, so its
tokens are in the input's token count and truncation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.errors import InvalidArgument, quote
from service.manifest import Manifest

MAX_PROMPT_CHARS = 16384  # an explicit prompt is an instruction, joined to every input of the call


@dataclass(frozen=True)
class Prompts:
    model: str
    texts: dict[str, str] = field(default_factory=dict)  # name -> prefix text
    default: str | None = None  # a name in texts

    @staticmethod
    def of(manifest: Manifest) -> Prompts:
        return Prompts(manifest.name, manifest.extra.get("prompts", {}), manifest.extra.get("default_prompt_name"))

    def prefix(self, prompt_name: str, prompt: str | None) -> str:
        """The text put before each input: `prompt` itself, the named prompt, else the default's (or "")."""
        if prompt is not None:
            if prompt_name:
                raise InvalidArgument("give prompt_name or prompt (the prefix text itself), not both")
            if len(prompt) > MAX_PROMPT_CHARS:
                raise InvalidArgument(f"prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS}")
            return prompt
        if not prompt_name:
            return self.texts.get(self.default, "") if self.default else ""
        if prompt_name not in self.texts:
            names = ", ".join(map(repr, self.texts)) if self.texts else "none"
            raise InvalidArgument(
                f"prompt_name {quote(prompt_name)} is not a prompt of model {self.model!r} (its prompts: {names})"
            )
        return self.texts[prompt_name]

    def apply(self, texts: list[str], prompt_name: str, prompt: str | None) -> list[str]:
        """texts, each after the chosen prefix."""
        prefix = self.prefix(prompt_name, prompt)
        return [prefix + t for t in texts] if prefix else texts
