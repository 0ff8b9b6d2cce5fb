"""The classification core: rerank (one query, N documents -> scores, best first), score (pairs -> one
score each: vLLM's /v1/score) and classify (texts or pairs -> every label's score), for every door.

Rules in one place: a query and every document must hold text (a blank one is refused like an
empty one: a reranker scores what is there to read); at most `rerank_max_documents` documents (or
pairs to score) and `classify_max_inputs` inputs per call; `top_n` < 1 refused, above the count
clamped; rerank and score need a model with one label (a classifier of several is refused, naming
its labels: use classify). Scores are the model's activation of its logits (sigmoid for one label,
softmax over several, as the export recorded it), or the logits themselves with `raw_scores`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from service.classification.tokenization import Input
from service.errors import InvalidArgument, label_model
from service.registry import ModelRegistry
from service.settings import Settings
from service.timings import Timings

if TYPE_CHECKING:
    from service.classification.model import ClassificationModel, LogitsResult


@dataclass(frozen=True)
class RerankQuery:
    query: str
    documents: list[str]
    model: str = ""  # empty: the default classification model
    top_n: int | None = None  # None: every document
    raw_scores: bool = False
    truncate: bool = True


@dataclass(frozen=True)
class ScoreQuery:
    pairs: list[tuple[str, str]]
    model: str = ""
    raw_scores: bool = False
    truncate: bool = True


@dataclass(frozen=True)
class ClassifyQuery:
    inputs: list[Input]  # a text, or a text and its pair
    model: str = ""
    raw_scores: bool = False
    truncate: bool = True


@dataclass(frozen=True)
class Scored:
    """Rerank: `indexes` best first (top_n of them) with their `scores`; score: every pair in order."""

    model: str
    indexes: list[int]
    scores: list[float]
    input_tokens: int
    timings: Timings


@dataclass(frozen=True)
class Classified:
    model: str
    labels: list[str]  # the model's, in id order
    scores: np.ndarray  # (N, L) float32: each input's score per label, in label order
    input_tokens: int
    timings: Timings


def _text(value: str, what: str) -> None:
    if not value.strip():
        raise InvalidArgument(f"{what} is empty; it must contain text")


def _count(n: int, limit: int, what: str, setting: str) -> None:
    if n == 0:
        raise InvalidArgument(f"{what} is empty; send at least one")
    if n > limit:
        raise InvalidArgument(f"{n} {what} in one call; the limit is {limit} ({setting}): split the call")


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """(N, L) logits -> scores: sigmoid (per label), softmax (over the labels) or none (the logits)."""
    logits = logits.astype(np.float64)
    if activation == "sigmoid":
        out = 1.0 / (1.0 + np.exp(-logits))
    elif activation == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        out = e / e.sum(axis=-1, keepdims=True)
    else:
        out = logits
    return out.astype(np.float32)


class ClassificationCore:
    def __init__(self, registry: ModelRegistry, settings: Settings):
        self.registry, self.settings = registry, settings

    def _model(self, name: str, one_label: bool) -> ClassificationModel:
        model = cast("ClassificationModel", self.registry.get("classification", name))
        label_model(model.name)
        if one_label and len(model.labels) != 1:
            raise InvalidArgument(
                f"model {model.name!r} is a classifier with {len(model.labels)} labels "
                f"({', '.join(model.labels)}); rerank and score need a model with one label (a reranker): "
                "use classify for it"
            )
        return model

    async def rerank(self, query: RerankQuery, deadline: float | None = None) -> Scored:
        """Scores every document against the query; -> the top_n, best first. Raises ServiceError."""
        start = time.perf_counter()
        _text(query.query, "query")
        _count(len(query.documents), self.settings.rerank_max_documents, "documents", "rerank_max_documents")
        for i, doc in enumerate(query.documents):
            _text(doc, f"documents[{i}]")
        if query.top_n is not None and query.top_n < 1:
            raise InvalidArgument(f"top_n={query.top_n}; it must be at least 1 (leave it out for every document)")
        pairs = [(query.query, d) for d in query.documents]
        model, r, scores = await self._scores(
            pairs, query.model, query.raw_scores, query.truncate, "documents", deadline
        )
        order = sorted(range(len(pairs)), key=lambda i: -scores[i])[: query.top_n]
        return Scored(model, order, [scores[i] for i in order], *_result_times(r, start))

    async def score(self, query: ScoreQuery, deadline: float | None = None) -> Scored:
        """One score per (text, text) pair, in order; the model must have one label."""
        start = time.perf_counter()
        _count(len(query.pairs), self.settings.rerank_max_documents, "pairs", "rerank_max_documents")
        for i, (first, second) in enumerate(query.pairs):
            _text(first, f"pairs[{i}] first text")
            _text(second, f"pairs[{i}] second text")
        model, r, scores = await self._scores(
            query.pairs, query.model, query.raw_scores, query.truncate, "pairs", deadline
        )
        return Scored(model, list(range(len(scores))), scores, *_result_times(r, start))

    async def _scores(
        self, pairs: list[tuple[str, str]], name: str, raw: bool, truncate: bool, what: str, deadline: float | None
    ) -> tuple[str, LogitsResult, list[float]]:
        model = self._model(name, one_label=True)
        r = await model.logits(list(pairs), truncate, what, deadline)
        scores = r.logits[:, 0] if raw else activate(r.logits, model.activation)[:, 0]
        return model.name, r, scores.tolist()

    async def classify(self, query: ClassifyQuery, deadline: float | None = None) -> Classified:
        """Every label's score for every input (a text or a pair)."""
        start = time.perf_counter()
        _count(len(query.inputs), self.settings.classify_max_inputs, "inputs", "classify_max_inputs")
        for i, (text, pair) in enumerate(query.inputs):
            _text(text, f"inputs[{i}]")
            if pair is not None:
                _text(pair, f"inputs[{i}] text pair")
        model = self._model(query.model, one_label=False)
        r = await model.logits(list(query.inputs), query.truncate, "inputs", deadline)
        scores = r.logits if query.raw_scores else activate(r.logits, model.activation)
        return Classified(model.name, model.labels, scores, *_result_times(r, start))


def _result_times(r: LogitsResult, start: float) -> tuple[int, Timings]:
    return r.input_tokens, Timings.of_seconds(time.perf_counter() - start, r.tokenize_s, r.queue_s, r.inference_s)
