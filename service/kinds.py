"""The model kinds, in one table of plain values: kind -> the gRPC services that need a model of it and
its model directory's graph roles. The manifest check, the registry's defaults and the server's health
read it; it imports nothing, so service/manifest.py (which export/ uses too) can. The code of a kind is
wired with plain imports where it is used: its backend class in service/cores.py `BACKENDS`, its core
in `Cores`, its gRPC door in service/server.py `GRPC_DOORS`, its KServe adapter in
service/kserve/dataplane.py `ADAPTERS`. Every place a new kind is named: docs/design/request-paths.md,
"A new kind".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str  # the manifest's "kind"
    services: tuple[str, ...]  # inference.v1 services that need a model of this kind to be SERVING
    roles: tuple[str, ...]  # the model directory's graphs it needs (service/manifest.py)
    max_inputs: str  # the Settings field bounding the texts of one call (checked before they are decoded)
    optional_roles: tuple[str, ...] = ()  # graphs it may have besides (and the attention graph)

    @property
    def default_setting(self) -> str:
        """The Settings field naming its default model: default_<kind>_model ("-" as "_")."""
        return f"default_{self.name.replace('-', '_')}_model"


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("embedding", ("EmbeddingService",), ("encoder",), "embed_max_inputs", ("packed",)),
        # a call's generations are admitted all or none: at most a full queue
        Kind("generation", ("GenerationService",), ("decoder",), "gen_max_queue"),
        Kind("translation", ("TranslationService",), ("encoder", "decoder"), "translate_max_inputs", ("packed",)),
        Kind("fill-mask", ("FillMaskService",), ("encoder",), "embed_max_inputs", ("packed",)),
        Kind("sparse-embedding", ("SparseEmbeddingService",), ("encoder",), "embed_max_inputs"),
        # KServe: the texts are a rerank's documents or classify's inputs (the core holds those to classify_max_inputs)
        Kind("classification", ("ClassificationService",), ("encoder",), "rerank_max_documents", ("packed",)),
    )
}
