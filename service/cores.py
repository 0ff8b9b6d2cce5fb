"""The cores of one process, built once over its registry and shared by every door (gRPC, HTTP, KServe)."""

from __future__ import annotations

from dataclasses import dataclass

from service.classification.core import ClassificationCore
from service.embedding.core import EmbeddingCore
from service.fillmask.core import FillMaskCore
from service.generation.core import GenerationCore
from service.inspection.core import AttentionCore
from service.models import ModelsCore
from service.registry import ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.translation.core import TranslationCore


@dataclass(frozen=True)
class Cores:
    """The cores over one registry (each kind's and the models'): what every door is built on."""

    registry: ModelRegistry
    settings: Settings
    embedding: EmbeddingCore
    fill_mask: FillMaskCore
    generation: GenerationCore
    translation: TranslationCore
    attention: AttentionCore
    models: ModelsCore
    classification: ClassificationCore

    @classmethod
    def build(cls, registry: ModelRegistry, settings: Settings, runtime: Runtime) -> Cores:
        return cls(
            registry,
            settings,
            EmbeddingCore(registry, settings),
            FillMaskCore(registry, settings),
            GenerationCore(registry),
            TranslationCore(registry, settings),
            AttentionCore(registry, settings, runtime),
            ModelsCore(registry),
            ClassificationCore(registry, settings),
        )
