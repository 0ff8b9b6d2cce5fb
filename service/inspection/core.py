"""The attention core: a text (and a translator's target) in, attention maps per layer and head out.

One `AttentionInspector` per served model, made on its first call in a thread (it loads the model's
tokenizer; its graph session opens on that call too).
An empty model name means the default embedding model; any served model may be named. At most
`attention_max_in_flight` calls compute at once (settings): a call holds whole-sequence maps of
every layer, far more memory than an embedding, so more are refused with RESOURCE_EXHAUSTED
before any work.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from service.admission import Admission
from service.errors import label_model
from service.inspection.attention import AttentionInspector, AttentionQuery, AttentionResult
from service.manifest import ModelDir
from service.registry import ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.timings import Timings

__all__ = ["AttentionCore", "AttentionMaps", "AttentionQuery"]


@dataclass(frozen=True)
class AttentionMaps:
    model: str
    kind: str  # the model's kind
    result: AttentionResult
    timings: Timings


class AttentionCore:
    def __init__(self, registry: ModelRegistry, settings: Settings, runtime: Runtime):
        self.registry, self.settings, self.runtime = registry, settings, runtime
        self._inspectors: dict[str, asyncio.Future[AttentionInspector]] = {}
        self.admission = Admission(
            "attention", "", settings.attention_max_in_flight, "calls computing", gate=runtime.gate
        )

    async def attention(self, query: AttentionQuery, deadline: float | None = None) -> AttentionMaps:
        """Validates once, admits (a compute place), inspects; raises ServiceError."""
        start = time.perf_counter()
        backend = self.registry.find(query.model) if query.model else self.registry.get("embedding")
        label_model(backend.name)
        inspector = await self._inspector(backend)
        inspector.check(query)
        self.registry.admit()  # a translator's greedy target queues a translation: the same call
        with self.admission.holding():
            result = await inspector.inspect(query, deadline)
        timings = Timings.of_seconds(time.perf_counter() - start, result.tokenize_s, inference=result.inference_s)
        return AttentionMaps(backend.name, backend.kind, result, timings)

    async def _inspector(self, backend) -> AttentionInspector:
        """The model's inspector, made once, off the event loop (concurrent first calls share it)."""
        if backend.name not in self._inspectors:
            model_dir = ModelDir(self.registry.dirs[backend.name], backend.manifest)
            made = asyncio.to_thread(
                AttentionInspector, backend, model_dir, self.runtime, self.settings.max_message_bytes
            )
            self._inspectors[backend.name] = asyncio.ensure_future(made)
        try:
            return await asyncio.shield(self._inspectors[backend.name])
        except Exception:
            self._inspectors.pop(backend.name, None)  # a later call tries again
            raise
