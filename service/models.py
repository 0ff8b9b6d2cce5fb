"""The models core: what gRPC ModelService, HTTP /v1/models and KServe's metadata and readiness answer,
as plain ModelInfo values; one rule for naming a model (not empty, served) for every door."""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import InvalidArgument, label_model
from service.registry import Backend, ModelRegistry


@dataclass(frozen=True)
class ModelInfo:
    """One served model, as protos ModelInfo describes it (service/registry.py `model_info`)."""

    name: str
    kind: str
    execution_provider: str
    variant: str
    max_input_tokens: int
    max_output_tokens: int
    embedding_dimension: int  # 0 unless an embedding model
    vocab_size: int
    manifest: dict[str, str]  # a summary: opset, versions, parity figures, graph hashes
    is_default: bool  # served to a request of its kind that names no model


class ModelsCore:
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    def ready(self) -> bool:
        """Every model warmed up and the server not draining (the health check's SERVING)."""
        return self.registry.warmed and not self.registry.draining

    def list(self) -> list[ModelInfo]:
        self.registry.admit()
        return [self.info(b) for b in self.registry]

    def get(self, name: str) -> ModelInfo:
        self.registry.admit()
        return self.info(self.find(name))

    def find(self, name: str) -> Backend:
        """The served model `name`, labelling the call's metrics with it; INVALID_ARGUMENT when the
        name is empty, NOT_FOUND naming the served ones when it is unknown."""
        if not name:
            raise InvalidArgument(
                "model name is empty; name a served model (ListModels, GET /v1/models and the KServe "
                "repository index list them)"
            )
        backend = self.registry.find(name)
        label_model(backend.name)
        return backend

    def info(self, backend: Backend) -> ModelInfo:
        return ModelInfo(**backend.info(), is_default=self.registry.is_default(backend))
