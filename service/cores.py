"""The cores of one process, built once over its registry and shared by every door (gRPC, HTTP, KServe),
and the backend class of each kind, which the registry loads models with (`BACKENDS`)."""

from __future__ import annotations

from dataclasses import dataclass

from service.classification.core import ClassificationCore
from service.classification.model import ClassificationModel
from service.embedding.core import EmbeddingCore
from service.embedding.model import EmbeddingModel
from service.fillmask.core import FillMaskCore
from service.fillmask.model import FillMaskModel
from service.generation.core import GenerationCore
from service.generation.model import GenerationModel
from service.inspection.core import AttentionCore
from service.models import ModelsCore
from service.registry import Backend, ModelRegistry
from service.runtime import Runtime
from service.settings import Settings
from service.sparse.core import SparseEmbeddingCore
from service.sparse.model import SparseEmbeddingModel
from service.translation.core import TranslationCore
from service.translation.model import TranslationModel

BACKENDS: dict[str, type[Backend]] = {  # kind (service/kinds.py) -> the class that serves a model of it
    "embedding": EmbeddingModel,
    "generation": GenerationModel,
    "translation": TranslationModel,
    "fill-mask": FillMaskModel,
    "classification": ClassificationModel,
    "sparse-embedding": SparseEmbeddingModel,
}


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
    sparse: SparseEmbeddingCore

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
            SparseEmbeddingCore(registry, settings),
        )
