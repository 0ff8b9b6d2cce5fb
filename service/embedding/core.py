"""The embedding core: texts in, an (N, D) float32 array out, for every door."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from service.core import check_inputs
from service.errors import label_model
from service.registry import ModelRegistry
from service.settings import Settings
from service.timings import Timings

if TYPE_CHECKING:
    from service.embedding.model import EmbeddingModel


@dataclass(frozen=True)
class EmbedQuery:
    inputs: list[str]
    model: str = ""  # empty: the default embedding model
    normalize: bool = True
    truncate: bool = True
    dimensions: int = 0  # 0: the model's full dimension
    prompt_name: str = ""  # one of the model's prompts; empty: its default prompt, if any (prompts.py)
    prompt: str | None = None  # the prefix text itself; not with prompt_name


@dataclass(frozen=True)
class Embeddings:
    model: str
    vectors: np.ndarray  # (N, D) float32, in input order
    input_tokens: int
    timings: Timings


class EmbeddingCore:
    def __init__(self, registry: ModelRegistry, settings: Settings):
        self.registry, self.settings = registry, settings

    async def embed(self, query: EmbedQuery, deadline: float | None = None) -> Embeddings:
        """Validates, admits (the model's queue places, before tokenizing) and embeds; raises ServiceError."""
        start = time.perf_counter()
        model, texts = self.checked(query)
        r = await model.embed(texts, query.normalize, query.truncate, query.dimensions, deadline)
        timings = Timings.of_seconds(time.perf_counter() - start, r.tokenize_s, r.queue_s, r.inference_s)
        return Embeddings(model.name, r.embeddings, r.input_tokens, timings)

    def checked(self, query: EmbedQuery) -> tuple[EmbeddingModel, list[str]]:
        """The query's inputs checked, its model (labelling the call) and its texts with their prompt."""
        check_inputs(
            query.inputs,
            self.settings.embed_max_inputs,
            "text to embed",
            blank_ok=True,  # "   " embeds its special tokens, as the model itself would
            split="split the call (or use EmbedStream)",
        )
        model = cast("EmbeddingModel", self.registry.get("embedding", query.model))
        label_model(model.name)
        return model, model.prompts.apply(query.inputs, query.prompt_name, query.prompt)
