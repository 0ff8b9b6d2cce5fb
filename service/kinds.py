"""The model kinds, in one table: kind -> its backend (loaded only when a model of it is served) and the
gRPC services it serves. The registry, the manifest check, the settings' default models and the
server's health all read it; a new kind is one row here plus its package (docs/design/request-paths.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    name: str  # the manifest's "kind"
    backend: str  # "module:Class" of its registry backend
    services: tuple[str, ...]  # inference.v1 services that need a model of this kind to be SERVING

    @property
    def default_setting(self) -> str:
        """The Settings field naming its default model: default_<kind>_model ("-" as "_")."""
        return f"default_{self.name.replace('-', '_')}_model"

    def backend_class(self) -> Any:
        module, _, attr = self.backend.partition(":")
        return getattr(importlib.import_module(module), attr)


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("embedding", "service.embedding.model:EmbeddingModel", ("EmbeddingService",)),
        Kind("generation", "service.generation.model:GenerationModel", ("GenerationService",)),
        Kind("translation", "service.translation.model:TranslationModel", ("TranslationService",)),
        Kind("fill-mask", "service.fillmask.model:FillMaskModel", ("FillMaskService",)),
    )
}

# The gRPC doors, each a module with `register(server, cores)`: every service is registered this one way.
GRPC_DOORS = (
    "service.embedding.grpc",
    "service.generation.grpc",
    "service.translation.grpc",
    "service.fillmask.grpc",
    "service.inspection.grpc",
    "service.modelservice",
    "service.kserve.servicer",
)
