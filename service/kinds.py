"""The model kinds, in one table: kind -> its backend (loaded only when a model of it is served), the
gRPC services it serves, its model directory's graph roles and (by its package) its KServe adapter,
service/<kind>/oip.py. The registry, the manifest check, the default-model settings, KServe and the
server's health read it. What else a new kind names (its core in cores.py, its setting, its protos):
docs/design/request-paths.md, "A new kind".
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
    roles: tuple[str, ...]  # the model directory's graphs it needs (service/manifest.py)
    max_inputs: str  # the Settings field bounding the texts of one call (checked before they are decoded)
    optional_roles: tuple[str, ...] = ()  # graphs it may have besides (and the attention graph)

    @property
    def oip(self) -> str:
        """Its Open Inference Protocol adapter (service/kserve/adapter.py): service/<kind>/oip.py."""
        return f"{self.backend.partition(':')[0].rpartition('.')[0]}.oip"

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
        Kind(
            "embedding",
            "service.embedding.model:EmbeddingModel",
            ("EmbeddingService",),
            ("encoder",),
            "embed_max_inputs",
            ("packed",),
        ),
        Kind(
            "generation",
            "service.generation.model:GenerationModel",
            ("GenerationService",),
            ("decoder",),
            "gen_max_queue",  # a call's generations are admitted all or none: at most a full queue
        ),
        Kind(
            "translation",
            "service.translation.model:TranslationModel",
            ("TranslationService",),
            ("encoder", "decoder"),
            "translate_max_inputs",
            ("packed",),
        ),
        Kind(
            "fill-mask",
            "service.fillmask.model:FillMaskModel",
            ("FillMaskService",),
            ("encoder",),
            "embed_max_inputs",
            ("packed",),
        ),
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
