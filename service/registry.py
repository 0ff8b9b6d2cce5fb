"""The served models: the `Backend` protocol every model kind implements, and `ModelRegistry`.

`ModelRegistry.load` reads every model directory under the models root (verified by
`service.manifest.load_model_dir`) and builds one backend per directory, the class its manifest's
kind names in the table it is handed (service/cores.py `BACKENDS`: the kinds' packages import this
module, so it names none of them). One model per kind (service/kinds.py) is the default: the
settings' `default_<kind>_model`, else the one whose manifest says `extra["default"]: true`, else
the first by name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from service import metrics
from service.admission import Gate
from service.errors import InvalidArgument, NotFound, quote
from service.kinds import KINDS
from service.manifest import Manifest, ModelDir, ModelDirError, discover, load_model_dir
from service.runtime import QUANTISED, ProviderError, Runtime, gate_verdict
from service.settings import Settings

log = logging.getLogger(__name__)


@runtime_checkable
class Backend(Protocol):
    """One served model. Engines and schedulers behind it never see protobuf."""

    name: str
    kind: str
    manifest: Manifest
    provider: str  # execution provider actually in use, e.g. "CPUExecutionProvider"
    variant: str  # graph variant served: fp32 | optimized | fp16 | int8

    @classmethod
    def load(cls, model_dir: ModelDir, settings: Settings, runtime: Runtime) -> Backend: ...

    async def start(self) -> None:
        """Starts the model's queue / scheduler task."""

    async def warmup(self) -> None:
        """Runs a real forward pass; raises on failure (health stays NOT_SERVING)."""

    async def stop(self) -> None:
        """Finishes queued work (the server's grace period bounds it), then stops the task."""

    def info(self) -> dict[str, Any]:
        """Fields of protos ModelInfo (see `model_info`), without is_default."""


class ModelLoadError(RuntimeError):
    """A model directory that cannot be served; the message names it and the cause."""


def model_info(backend: Backend, vocab_size: int) -> dict[str, Any]:
    """The ModelInfo fields every backend shares; backends call this from `info()`."""
    m = backend.manifest
    summary = {
        "opset": str(m.opset),
        "format_version": str(m.format_version),
        "architecture": str(m.architecture.get("type", "")),
        **{f"version.{k}": str(v) for k, v in m.versions.items()},
        **{f"parity.{k}": str(v) for k, v in m.parity.items() if not isinstance(v, (dict, list))},
        **{f"sha256.{g.role}.{g.variant}": g.sha256 for g in m.graphs},
        **{f"gate.{v}": gate_verdict(m, v) for v in QUANTISED if v in {g.variant for g in m.graphs}},
    }
    speed = m.parity.get("speed")
    if speed:  # the export's decode-step timings that `auto` chose by (export/gate/speed.py)
        summary["speed.cpu"] = str(speed.get("cpu", {}).get("name", "unknown"))
        summary.update({f"speed.step_us.{v}": str(us) for v, us in speed.get("step_us", {}).items()})
    if m.pooling:
        summary["pooling"] = m.pooling
    return {
        "name": backend.name,
        "kind": backend.kind,
        "execution_provider": backend.provider,
        "max_input_tokens": m.max_input_tokens,
        "embedding_dimension": m.embedding_dim or 0,
        "vocab_size": vocab_size,
        "variant": backend.variant,
        "manifest": summary,
        "max_output_tokens": m.max_output_tokens or 0,
    }


class ModelRegistry:
    def __init__(
        self,
        backends: list[Backend],
        defaults: dict[str, str],
        dirs: dict[str, Path] | None = None,
        gate: Gate | None = None,
    ):
        self._by_name = {b.name: b for b in backends}
        self.dirs = dirs or {}  # model name -> its directory (InspectionService opens its attention graph)
        self.defaults = defaults  # kind -> default model name
        self.gate = gate or Gate()  # the process's drain gate (Runtime.gate): every model's admission checks it
        self.warmed = False  # every model's warm-up passed (start()): KServe readiness reads it with the drain

    @property
    def draining(self) -> bool:
        return self.gate.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        """Set by the server on SIGTERM: every admission (service/admission.py) then refuses new calls."""
        self.gate.draining = value

    def admit(self) -> None:
        """Admits the current call to the server (UNAVAILABLE while draining; Gate.enter): for calls that
        take no queue place (ModelService, KServe metadata) and calls that take several (a stream)."""
        self.gate.enter()

    @classmethod
    def load(cls, settings: Settings, runtime: Runtime, backends: Mapping[str, type[Backend]]) -> ModelRegistry:
        """Loads every model directory under settings.models, each with the class `backends` names for its
        kind; raises ModelLoadError naming the cause."""
        dirs = discover(settings.models)
        if not dirs:
            raise ModelLoadError(
                f"no model directories (folders with model.json) under {Path(settings.models)}; "
                "run `make models` or pass --models DIR"
            )
        served = [cls._load_one(path, settings, runtime, backends) for path in dirs]
        names = [b.name for b in served]
        if len(set(names)) != len(names):
            raise ModelLoadError(f"duplicate model names under {settings.models}: {sorted(names)}")
        chats = {b.name for b in served if b.kind == "generation"}
        for setting, by_model in (
            ("chat_template", settings.chat_templates()),
            ("tool_parser", settings.tool_parsers()),
        ):
            unknown = sorted(set(by_model) - chats)
            if unknown:
                raise ModelLoadError(
                    f"{setting} names {', '.join(unknown)}, not a generation model served here "
                    f"(generation models: {', '.join(sorted(chats)) or 'none'})"
                )
        registry = cls(served, _defaults(served, settings), dict(zip(names, dirs)), runtime.gate)
        for b in served:
            metrics.MODEL_INFO.labels(b.name, b.kind, b.provider, b.variant, runtime.requested_provider).set(1)
            log.info(
                "model %s: kind=%s provider=%s (requested %s) variant=%s default=%s from %s",
                b.name,
                b.kind,
                b.provider,
                runtime.requested_provider,
                b.variant,
                registry.is_default(b),
                settings.models,
            )
        return registry

    @staticmethod
    def _load_one(path: Path, settings: Settings, runtime: Runtime, backends: Mapping[str, type[Backend]]) -> Backend:
        """One directory's backend; every failure names the directory, or the file when it is known."""
        model_dir = load_model_dir(path, verify_hashes=settings.verify_hashes)
        kind = model_dir.manifest.kind
        if kind not in backends:
            raise ModelLoadError(f"{path}: no backend for kind {kind!r} (service/cores.py BACKENDS)")
        try:
            return backends[kind].load(model_dir, settings, runtime)
        except (ModelDirError, ModelLoadError, ProviderError):
            raise  # their messages name the file already
        except Exception as e:  # a file that loads but cannot be served (bad names, bad UTF-8...)
            m = model_dir.manifest
            files = ", ".join(sorted({g.file for g in m.graphs} | {m.tokenizer["file"]}))
            raise ModelDirError(
                f"{path}: cannot serve this model directory ({type(e).__name__}: {e}); its files: {files}"
            ) from e

    def __iter__(self) -> Iterator[Backend]:
        return iter(sorted(self._by_name.values(), key=lambda b: b.name))

    def is_default(self, backend: Backend) -> bool:
        return self.defaults.get(backend.kind) == backend.name

    def get(self, kind: str, name: str = "") -> Backend:
        """The model `name` of `kind` (empty: the default); NotFound / InvalidArgument say what exists."""
        if not name:
            if kind not in self.defaults:
                raise NotFound(f"no {kind} model is served here (served: {self._summary()})")
            return self._by_name[self.defaults[kind]]
        backend = self._by_name.get(name)
        if backend is None:
            raise NotFound(f"unknown model {quote(name)}; available {kind} models: {self._names(kind) or 'none'}")
        if backend.kind != kind:
            raise InvalidArgument(
                f"model {quote(name)} is a {backend.kind} model, not a {kind} model; "
                f"available {kind} models: {self._names(kind) or 'none'}"
            )
        return backend

    def find(self, name: str) -> Backend:
        """Any model by name (ModelService.GetModel)."""
        if name not in self._by_name:
            available = ", ".join(sorted(self._by_name)) or "none"
            raise NotFound(f"unknown model {quote(name)}; available models: {available}")
        return self._by_name[name]

    def _names(self, kind: str) -> str:
        return ", ".join(b.name for b in self if b.kind == kind)

    def _summary(self) -> str:
        return ", ".join(f"{b.name} ({b.kind})" for b in self) or "none"

    async def start(self) -> None:
        """Starts every model's task and runs its warm-up pass; raises if any warm-up fails."""
        for b in self:
            await b.start()
        for b in self:
            await b.warmup()
            log.info("model %s warmed up", b.name)
        self.warmed = True

    async def stop(self) -> None:
        """Stops every model (each drains what it was given)."""
        await asyncio.gather(*(b.stop() for b in self), return_exceptions=False)


def _defaults(backends: list[Backend], settings: Settings) -> dict[str, str]:
    out: dict[str, str] = {}
    for kind, spec in KINDS.items():
        if not hasattr(settings, spec.default_setting):  # a kind added to service/kinds.py without its setting
            raise ModelLoadError(
                f"kind {kind!r} has no setting {spec.default_setting}: add that field to service/settings.py "
                "(docs/design/request-paths.md lists what a new kind names)"
            )
        of_kind = sorted((b for b in backends if b.kind == kind), key=lambda b: b.name)
        if not of_kind:
            continue
        override = getattr(settings, spec.default_setting)
        if override:
            if override not in {b.name for b in of_kind}:
                raise ModelLoadError(
                    f"{spec.default_setting}={override!r} is not a served {kind} model "
                    f"(have: {', '.join(b.name for b in of_kind)})"
                )
            out[kind] = override
            continue
        flagged = [b.name for b in of_kind if b.manifest.extra.get("default") is True]
        out[kind] = flagged[0] if flagged else of_kind[0].name
    return out
