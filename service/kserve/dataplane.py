"""The Open Inference Protocol's operations over plain values, shared by its gRPC and REST bindings.

Every served model is one OIP model, version "1", with one input `text` (BYTES [N], UTF-8 texts)
and the outputs of its kind. What a kind adds (its outputs, its parameters named like the fields of
its inference.v1 request, one inference over its core) is its module `service/kserve/<kind>.py`
(adapter.py), in the table `ADAPTERS`; servicer.py (gRPC) and rest.py (HTTP) convert their wire
formats to and from these calls.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from service.cores import Cores
from service.errors import InvalidArgument, NotFound, quote
from service.kinds import KINDS
from service.kserve import classification, embedding, fillmask, generation, sparse, translation
from service.kserve.adapter import Adapter
from service.kserve.arrays import Expect, Scalar, Spec, Tensor
from service.kserve.parameters import checked
from service.registry import Backend

SERVER_NAME = "transformer-serving"
VERSION = "1"  # models are not versioned here; "" or "1" both name the served one
INPUT = "text"
TEXTS = ("BYTES", [-1])
ADAPTERS: dict[str, Adapter] = {  # kind (service/kinds.py) -> its adapter
    "embedding": embedding,
    "fill-mask": fillmask,
    "generation": generation,
    "translation": translation,
    "classification": classification,
    "sparse-embedding": sparse,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass(frozen=True)
class Inference:
    model: str
    outputs: list[Tensor]  # the ones asked for, in the order asked
    input_tokens: int
    output_tokens: int


def server_version() -> str:
    try:
        return importlib.metadata.version(SERVER_NAME)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


class DataPlane:
    """What both bindings call, over the cores every door shares (service/cores.py)."""

    def __init__(self, cores: Cores):
        self.cores, self.registry, self.settings = cores, cores.registry, cores.settings

    def ready(self) -> bool:
        return self.cores.models.ready()

    def model(self, name: str, version: str) -> Backend:
        """The served model `name` (the models core's rule, service/models.py) at `version`."""
        model = self.cores.models.find(name)
        if version not in ("", VERSION):
            raise NotFound(
                f"model {quote(name)} has no version {quote(version)}; its only version is "
                f"{VERSION!r} (or leave it out)"
            )
        return model

    def model_ready(self, name: str, version: str) -> bool:
        try:
            self.model(name, version)
        except NotFound:
            return False
        return self.ready()

    def model_metadata(self, name: str, version: str) -> ModelMetadata:
        model = self.admit(name, version)
        kind_outputs = ADAPTERS[model.kind].outputs(self.cores.models.info(model))
        outputs = [TensorSpec(output, datatype, shape) for output, (datatype, shape) in kind_outputs.items()]
        return ModelMetadata(model.name, [VERSION], f"{SERVER_NAME}/{model.kind}", [TensorSpec(INPUT, *TEXTS)], outputs)

    def repository_index(self) -> list[dict]:
        """Triton's repository index: every served model, READY unless the server drains."""
        self.registry.admit()
        return [{"name": b.name, "version": VERSION, "state": "READY"} for b in self.registry]

    def expect_texts(self, model: Backend) -> Expect:
        """The rules on a call's inputs (one `text` input, BYTES [N], at most the kind's limit of texts),
        for the bindings to apply before any element is decoded."""
        setting = KINDS[model.kind].max_inputs
        return lambda specs: check_text_input(specs, getattr(self.settings, setting), setting)

    def admit(self, name: str, version: str) -> Backend:
        """The model a call names, once the server admits the call (UNAVAILABLE while draining)."""
        self.registry.admit()
        return self.model(name, version)

    async def infer(
        self,
        model: Backend,
        texts: list[str],
        outputs: list[str],
        parameters: dict[str, Scalar],
        deadline: float | None,
    ) -> Inference:
        """Runs `model` (from `admit`) on the `text` input's texts; outputs: the names wanted (empty:
        all). The outputs and parameters are checked before any work."""
        kind = ADAPTERS[model.kind]
        wanted = requested_outputs(outputs, model.kind, list(kind.outputs(None)))
        values = checked(parameters, kind.PARAMETERS, model.kind)
        produced = await kind.infer(self.cores, model.name, texts, values, deadline)
        by_name = {t.name: t for t in produced.outputs}
        return Inference(model.name, [by_name[n] for n in wanted], produced.input_tokens, produced.output_tokens)


def check_text_input(specs: list[Spec], most: int, setting: str) -> None:
    """InvalidArgument naming what is wrong with the inputs' names, datatypes and shapes (both bindings
    check them with this before decoding any element): one input `text`, BYTES [N], 1 <= N <= most."""
    if [s.name for s in specs] != [INPUT]:
        names = ", ".join(quote(s.name) for s in specs[:8]) + (", …" if len(specs) > 8 else "")
        raise InvalidArgument(f"inputs are [{names}]; send exactly one input named {INPUT!r} (BYTES, shape [N])")
    spec = specs[0]
    if spec.datatype != "BYTES":
        raise InvalidArgument(f"input {INPUT!r} has datatype {quote(spec.datatype)}; it must be BYTES (UTF-8 texts)")
    if len(spec.shape) != 1:
        raise InvalidArgument(f"input {INPUT!r} has shape {spec.shape}; it must be [N], one text per element")
    if not spec.count:
        raise InvalidArgument(f"input {INPUT!r} is empty; send at least one text")
    if spec.count > most:
        raise InvalidArgument(f"{spec.count} inputs in one call; the limit is {most} ({setting}): split the call")


def input_texts(inputs: list[Tensor]) -> list[str]:
    """The `text` input's elements as strings (its tensor checked by check_text_input)."""
    tensor = inputs[0]
    try:
        return [e.decode("utf-8") for e in tensor.array]
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"input {INPUT!r} holds an element that is not UTF-8 ({e.reason})") from e


def requested_outputs(names: list[str], kind: str, known: list[str]) -> list[str]:
    """The outputs to return (all when none is asked for), checked before any work."""
    for name in names:
        if name not in known:
            raise InvalidArgument(f"unknown output {quote(name)}; a {kind} model returns {', '.join(known)}")
    return names or known
