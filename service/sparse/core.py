"""The sparse-embedding core: texts in, each text's non-zero vocabulary weights out, for every door.

The model (model.py) computes the (N, V) weights, log(1 + ReLU(logits)) pooled over each input's
tokens, in one graph; here each row becomes its (indices, values) pairs, indices ascending, as
sentence-transformers' `SparseEncoder.encode` returns a sparse tensor and TEI's `/embed_sparse` a
list of {index, value}.
"""

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
    from service.sparse.model import SparseEmbeddingModel


@dataclass(frozen=True)
class SparseQuery:
    inputs: list[str]
    model: str = ""  # empty: the default sparse-embedding model
    truncate: bool = True
    prompt_name: str = ""  # as EmbedQuery's (service/embedding/prompts.py)
    prompt: str | None = None


@dataclass(frozen=True)
class SparseVector:
    indices: np.ndarray  # (K,) int64, ascending: the vocabulary ids whose weight is not zero
    values: np.ndarray  # (K,) float32, > 0


@dataclass(frozen=True)
class SparseEmbeddings:
    model: str
    vectors: list[SparseVector]  # in input order
    input_tokens: int
    timings: Timings


def sparse_rows(weights: np.ndarray) -> list[SparseVector]:
    """(N, V) weights -> each row's non-zero entries."""
    rows, cols = np.nonzero(weights)  # row-major: rows ascending, columns ascending within a row
    ends = np.searchsorted(rows, np.arange(1, len(weights) + 1))  # (N,) where each row's entries end
    starts = np.concatenate([[0], ends[:-1]])
    values = weights[rows, cols].astype(np.float32, copy=False)
    return [SparseVector(cols[s:e].astype(np.int64), values[s:e]) for s, e in zip(starts, ends, strict=True)]


class SparseEmbeddingCore:
    def __init__(self, registry: ModelRegistry, settings: Settings):
        self.registry, self.settings = registry, settings

    async def embed_sparse(self, query: SparseQuery, deadline: float | None = None) -> SparseEmbeddings:
        """Validates, admits (before tokenizing) and embeds; a model of another kind named: InvalidArgument."""
        start = time.perf_counter()
        check_inputs(
            query.inputs,
            self.settings.embed_max_inputs,
            "text to embed",
            blank_ok=True,
            split="split the call",
        )
        model = cast("SparseEmbeddingModel", self.registry.get("sparse-embedding", query.model))
        label_model(model.name)
        texts = model.prompts.apply(query.inputs, query.prompt_name, query.prompt)
        r = await model.embed(texts, normalize=False, truncate=query.truncate, deadline=deadline)
        timings = Timings.of_seconds(time.perf_counter() - start, r.tokenize_s, r.queue_s, r.inference_s)
        return SparseEmbeddings(model.name, sparse_rows(r.embeddings), r.input_tokens, timings)
