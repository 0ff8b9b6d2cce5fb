"""A Hugging Face model folder on disk: config.json, weights (safetensors, sharded or not, or
pytorch_model.bin), tokenizer files and, for sentence-transformers folders, modules.json.

Nothing here downloads: a path that is not a folder with a config.json is refused.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from export.convert.errors import ConversionError

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


class HFFolder:
    """One local checkpoint folder (a sentence-transformers folder's weights live at its root)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise ConversionError(
                f"{self.path}: not a folder (convert reads a local Hugging Face folder; it never downloads)"
            )
        if not (self.path / "config.json").is_file():
            raise ConversionError(f"{self.path}: no config.json (not a Hugging Face model folder)")

    def json(self, name: str) -> Any:
        """A JSON file of the folder (its parsed value: an object or a list), or None when it is absent."""
        file = self.path / name
        return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None

    @cached_property
    def config(self) -> dict[str, Any]:
        return self.json("config.json")

    def where(self, name: str = "config.json") -> str:
        return str(self.path / name)

    @property
    def architecture(self) -> str:
        """config.json's `architectures[0]` (or its model_type when it names none)."""
        archs = self.config.get("architectures") or []
        return archs[0] if archs else str(self.config.get("model_type", ""))

    @cached_property
    def modules(self) -> list[dict] | None:
        """sentence-transformers' modules.json (the pipeline: Transformer, Pooling, Normalize, ...)."""
        return self.json("modules.json")

    def weight_files(self) -> list[Path]:
        for index in (SAFETENSORS_INDEX, BIN_INDEX):
            if (self.path / index).is_file():
                shards = sorted(set(self.json(index)["weight_map"].values()))
                missing = [s for s in shards if not (self.path / s).is_file()]
                if missing:
                    raise ConversionError(f"{self.where(index)}: shard(s) {', '.join(missing)} missing")
                return [self.path / s for s in shards]
        for single in (SAFETENSORS, BIN):
            if (self.path / single).is_file():
                return [self.path / single]
        raise ConversionError(f"{self.path}: no weights ({SAFETENSORS}, {SAFETENSORS_INDEX}, {BIN} or {BIN_INDEX})")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor of every shard, as float32 where it is floating point."""
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in self.weight_files():
            if file.suffix == ".safetensors":
                part = load_file(str(file))
            else:
                part = torch.load(str(file), map_location="cpu", weights_only=True)
            state.update(part)
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def fast_tokenizer(folder: HFFolder):
    """The folder's tokenizer as a `tokenizers.Tokenizer` (what a model directory ships): through
    transformers' AutoTokenizer, so tokenizer_config.json's settings (add_bos_token, special
    tokens) and a vocab.txt-only BERT folder come out as transformers applies them."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConversionError(f"{folder.path}: no usable tokenizer ({e})") from e
    if not getattr(tok, "is_fast", False) or getattr(tok, "backend_tokenizer", None) is None:
        raise ConversionError(f"{folder.path}: the tokenizer ({type(tok).__name__}) has no fast (tokenizers) form")
    return Tokenizer.from_str(tok.backend_tokenizer.to_str()), tok
