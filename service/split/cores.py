"""A front end's cores: the classes of service/cores.py `Cores` whose compute methods send the call
to the engine core (service/split/client.py) instead of running it. What the doors read besides
(models, their info, tokenizers, chat templates) is answered here from the front end's registry
(service/split/models.py). An embedding call is checked and tokenized here and only batched and
computed in the engine. Every check and refusal of another forwarded call runs in the engine, in the
same code as in one process; a call is labelled here with the model its query names, when it names
a served one (the engine's own checks decide what the client is told), and refused while this front
end drains."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, TypeVar

from service.classification.core import ClassificationCore
from service.cores import Cores
from service.embedding.core import EmbeddingCore, Embeddings
from service.embedding.engine import postprocess
from service.embedding.model import check_dimensions
from service.errors import ServiceError, label_model
from service.fillmask.core import FillMaskCore
from service.generation.constraint import Compiled
from service.generation.core import GenerationCore
from service.generation.query import GenerateQuery
from service.inspection.core import AttentionCore
from service.models import ModelsCore
from service.registry import ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.sparse.core import SparseEmbeddingCore
from service.split.client import Engines
from service.timings import Timings
from service.translation.core import TranslationCore


def _label(registry: ModelRegistry, kind: str, name: str) -> None:
    try:
        backend = registry.get(kind, name) if kind else registry.find(name)
    except ServiceError:
        return  # the engine's checks say what is wrong, in the order one process would
    label_model(backend.name)


class _Forward:
    """Sends core `core`'s calls to the engine."""

    core, kind = "", ""
    registry: ModelRegistry
    client: Engines

    async def _forward(self, method: str, query: Any, deadline: float | None) -> Any:
        self.registry.gate.check()  # this front end drains: new calls UNAVAILABLE (an open stream's go on)
        _label(self.registry, self.kind, query.model)
        return await self.client.call(self.core, method, query, deadline)


_F = TypeVar("_F", bound=_Forward)


class RemoteEmbeddingCore(_Forward, EmbeddingCore):
    """Checks, tokenizes and post-processes here, in the order one process does (the queue's places
    are taken in the engine, after tokenizing: a full queue refuses an already tokenized call); the
    engine batches and computes."""

    core, kind = "embedding", "embedding"

    async def embed(self, query, deadline=None):
        self.registry.gate.check()
        start = time.perf_counter()
        model, texts = self.checked(query)
        check_dimensions(model.name, model.dimension, query.dimensions)
        model.admission.check(len(texts))
        tokenized = time.perf_counter()
        encoded = await model.tokenizer.encode_checked(texts, query.truncate, model.name)
        tokenize_s = time.perf_counter() - tokenized
        r = await self.client.embed(model.name, encoded, deadline)
        vectors = postprocess(r.rows, query.normalize, query.dimensions)
        timings = Timings.of_seconds(time.perf_counter() - start, tokenize_s, r.queue_s, r.inference_s)
        return Embeddings(model.name, vectors, r.input_tokens, timings)


class RemoteTranslationCore(_Forward, TranslationCore):
    core, kind = "translation", "translation"

    async def translate(self, query, deadline=None):
        return await self._forward("translate", query, deadline)


class RemoteFillMaskCore(_Forward, FillMaskCore):
    core, kind = "fill_mask", "fill-mask"

    async def fill_mask(self, query, deadline=None):
        return await self._forward("fill_mask", query, deadline)


class RemoteClassificationCore(_Forward, ClassificationCore):
    core, kind = "classification", "classification"

    async def rerank(self, query, deadline=None):
        return await self._forward("rerank", query, deadline)

    async def score(self, query, deadline=None):
        return await self._forward("score", query, deadline)

    async def classify(self, query, deadline=None):
        return await self._forward("classify", query, deadline)


class RemoteSparseEmbeddingCore(_Forward, SparseEmbeddingCore):
    core, kind = "sparse", "sparse-embedding"

    async def embed_sparse(self, query, deadline=None):
        return await self._forward("embed_sparse", query, deadline)


class RemoteAttentionCore(_Forward, AttentionCore):
    core = "attention"  # any served model (kind "": registry.find)

    async def attention(self, query, deadline=None):
        return await self._forward("attention", query, deadline)


class RemoteGenerationCore(_Forward, GenerationCore):
    """Tokenizer calls answered here; text prompts tokenized here where the engine would take their
    ids exactly as it takes the text (`_tokenized`); generations checked, admitted and run in the
    engine."""

    core, kind = "generation", "generation"

    async def generate_many(self, queries, deadline=None):
        self.registry.gate.check()
        if queries:
            _label(self.registry, self.kind, queries[0].model)
            queries = await self._tokenized(queries)
        return await self.client.generate([_sendable(q) for q in queries], deadline)

    async def _tokenized(self, queries: list[GenerateQuery]) -> list[GenerateQuery]:
        """The queries with each text prompt the engine would accept as text replaced by its token ids
        (the same tokenizer, start token included), so the engine does not tokenize it: a prompt it
        would queue with exactly these ids, whose text shows in no answer (no echo, no scores: the
        engine shapes those from the prompt's text). Any other prompt crosses as its text, and the
        engine's own checks refuse it as one process would (a text over the character or token
        limit, one with no tokens). A full queue refuses after this tokenizing."""
        try:
            model = self.registry.get("generation", queries[0].model)
        except ServiceError:
            return queries  # the engine names what is wrong
        if any(q.model != queries[0].model for q in queries):
            return queries
        limit = model.max_prompt_chars  # type: ignore[attr-defined]
        plain = [
            i
            for i, q in enumerate(queries)
            if isinstance(q.prompt, str)
            and q.prompt
            and not q.shaped
            and q.params.prompt_logprobs is None
            and (limit is None or len(q.prompt) <= limit)
        ]
        if not plain:
            return queries
        encoded = await model.text_encoder.encode([queries[i].prompt for i in plain])  # type: ignore[attr-defined]
        out = list(queries)
        for i, encoding in zip(plain, encoded, strict=True):
            ids = encoding.ids
            if 0 < len(ids) <= model.max_prompt and max(ids) < model.vocab_size:  # type: ignore[attr-defined]
                out[i] = dataclasses.replace(queries[i], prompt=ids)
        return out


def _sendable(query: GenerateQuery) -> GenerateQuery:
    """A structured output crosses as its structure (checked here); the engine compiles it (cached)."""
    compiled = query.params.constraint
    if not isinstance(compiled, Compiled):
        return query
    return dataclasses.replace(query, params=dataclasses.replace(query.params, constraint=compiled.structure))


def remote_cores(registry: ModelRegistry, settings: Settings, runtime: Runtime, client: Engines) -> Cores:
    """Cores over the front end's registry whose compute runs in the engines behind `client`. Every
    field named, so a core added to `Cores` without its remote counterpart fails the type check."""

    def remote(core: _F) -> _F:
        core.client = client
        return core

    return Cores(
        registry=registry,
        settings=settings,
        embedding=remote(RemoteEmbeddingCore(registry, settings)),
        fill_mask=remote(RemoteFillMaskCore(registry, settings)),
        generation=remote(RemoteGenerationCore(registry)),
        translation=remote(RemoteTranslationCore(registry, settings)),
        attention=remote(RemoteAttentionCore(registry, settings, runtime)),
        models=ModelsCore(registry),
        classification=remote(RemoteClassificationCore(registry, settings)),
        sparse=remote(RemoteSparseEmbeddingCore(registry, settings)),
    )
