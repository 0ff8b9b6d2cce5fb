"""The Open Inference Protocol's operations over plain values, shared by its gRPC and REST bindings.

Every served model is one OIP model, version "1", with one input and typed outputs:

    every kind   input  text         BYTES [N]        UTF-8 texts
    embedding    output embedding    FP32  [N, D]
    generation   output text_output  BYTES [N]
    translation  output translation  BYTES [N], score FP32 [N]
    fill-mask    output token        BYTES [N, M, K], token_id INT64 [N, M, K], score FP32 [N, M, K]

(fill-mask: M the most masks of any input, K = top_k; an input with fewer masks is padded with
token "", token_id -1, score 0). Request parameters are named like the fields of the kind's
inference.v1 request (parameters.py); servicer.py (gRPC) and rest.py (HTTP) convert their wire
formats to and from these calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
from dataclasses import dataclass

import numpy as np

from service.cores import Cores
from service.embedding.converters import embed_query
from service.errors import InvalidArgument, NotFound, quote
from service.fillmask.converters import fill_mask_query
from service.generation.converters import generate_query
from service.generation.core import join_chunks
from service.kserve.parameters import checked, embed_request, fill_mask_request, generate_request, translate_request
from service.kserve.tensors import Scalar, Tensor
from service.registry import Backend
from service.translation.converters import translate_query

SERVER_NAME = "transformer-serving"
VERSION = "1"  # models are not versioned here; "" or "1" both name the served one
INPUT = "text"
TEXTS = ("BYTES", [-1])
TENSORS = {  # kind -> output -> (datatype, shape); -1: any size; an embedding's D is the model's
    "embedding": {"embedding": ("FP32", [-1, -1])},
    "generation": {"text_output": ("BYTES", [-1])},
    "translation": {"translation": ("BYTES", [-1]), "score": ("FP32", [-1])},
    "fill-mask": {
        "token": ("BYTES", [-1, -1, -1]),
        "token_id": ("INT64", [-1, -1, -1]),
        "score": ("FP32", [-1, -1, -1]),
    },
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
        dimension = self.cores.models.info(model).embedding_dimension
        outputs = [
            TensorSpec(output, datatype, [-1, dimension] if model.kind == "embedding" else shape)
            for output, (datatype, shape) in TENSORS[model.kind].items()
        ]
        return ModelMetadata(model.name, [VERSION], f"{SERVER_NAME}/{model.kind}", [TensorSpec(INPUT, *TEXTS)], outputs)

    def repository_index(self) -> list[dict]:
        """Triton's repository index: every served model, READY unless the server drains."""
        self.registry.admit()
        return [{"name": b.name, "version": VERSION, "state": "READY"} for b in self.registry]

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
        wanted = requested_outputs(outputs, model.kind)
        values = checked(parameters, model.kind)
        run = {
            "embedding": self._embed,
            "generation": self._generate,
            "translation": self._translate,
            "fill-mask": self._fill_mask,
        }[model.kind]
        produced, input_tokens, output_tokens = await run(model, texts, values, deadline)
        by_name = {t.name: t for t in produced}
        return Inference(model.name, [by_name[n] for n in wanted], input_tokens, output_tokens)

    async def _embed(self, model: Backend, texts: list[str], values: dict, deadline: float | None) -> tuple:
        answer = await self.cores.embedding.embed(embed_query(embed_request(texts, model.name, values)), deadline)
        return [Tensor("embedding", "FP32", answer.vectors)], answer.input_tokens, 0

    async def _generate(self, model: Backend, texts: list[str], values: dict, deadline: float | None) -> tuple:
        """One generation per text, decoded together by the model's scheduler; admitted all or none."""
        queries = [
            dataclasses.replace(generate_query(generate_request(text, model.name, values)), prompt_name=f"text[{i}]")
            for i, text in enumerate(texts)
        ]
        generations = await self.cores.generation.generate_many(queries, deadline)
        try:
            results = await asyncio.gather(*(g.collect() for g in generations))
        finally:
            for generation in generations:  # frees the rows of every sequence when one fails or the call ends
                generation.cancel()
        done = [join_chunks(chunks) for chunks in results]  # the last chunk of each carries its token counts
        return (
            [Tensor("text_output", "BYTES", _texts([c.text for c in done]))],
            sum(c.input_tokens for c in done),
            sum(c.output_tokens for c in done),
        )

    async def _translate(self, model: Backend, texts: list[str], values: dict, deadline: float | None) -> tuple:
        query = translate_query(translate_request(texts, model.name, values))
        answer = await self.cores.translation.translate(query, deadline)
        outputs = [
            Tensor("translation", "BYTES", _texts([t.text for t in answer.translations])),
            Tensor("score", "FP32", np.array([t.score for t in answer.translations], dtype=np.float32)),
        ]
        return outputs, answer.input_tokens, answer.output_tokens

    async def _fill_mask(self, model: Backend, texts: list[str], values: dict, deadline: float | None) -> tuple:
        answer = await self.cores.fill_mask.fill_mask(
            fill_mask_query(fill_mask_request(texts, model.name, values)), deadline
        )
        masks = [[[(c.token, c.token_id, c.score) for c in mask] for mask in masks] for masks in answer.results]
        return fill_mask_tensors(masks), answer.input_tokens, 0


def fill_mask_tensors(results: list[list[list[tuple[str, int, float]]]]) -> list[Tensor]:
    """input -> mask -> candidates (token, id, score) as three [N, M, K] tensors, padded past an input's masks."""
    n, m = len(results), max(len(masks) for masks in results)
    k = max((len(c) for masks in results for c in masks), default=0)
    tokens = np.full((n, m, k), b"", dtype=object)
    ids = np.full((n, m, k), -1, dtype=np.int64)
    scores = np.zeros((n, m, k), dtype=np.float32)
    for i, masks in enumerate(results):
        for j, candidates in enumerate(masks):
            for c, (token, token_id, score) in enumerate(candidates):
                tokens[i, j, c], ids[i, j, c], scores[i, j, c] = token.encode(), token_id, score
    return [Tensor("token", "BYTES", tokens), Tensor("token_id", "INT64", ids), Tensor("score", "FP32", scores)]


def input_texts(inputs: list[Tensor]) -> list[str]:
    """The `text` input's elements as strings; InvalidArgument naming what is wrong with the tensors
    (both bindings decode their wire format to `Tensor`s and call this)."""
    if [t.name for t in inputs] != [INPUT]:
        raise InvalidArgument(
            f"inputs are {[quote(t.name) for t in inputs]}; send exactly one input named {INPUT!r} (BYTES, shape [N])"
        )
    tensor = inputs[0]
    if tensor.datatype != "BYTES":
        raise InvalidArgument(f"input {INPUT!r} has datatype {quote(tensor.datatype)}; it must be BYTES (UTF-8 texts)")
    if len(tensor.shape) != 1:
        raise InvalidArgument(f"input {INPUT!r} has shape {tensor.shape}; it must be [N], one text per element")
    if not tensor.shape[0]:
        raise InvalidArgument(f"input {INPUT!r} is empty; send at least one text")
    try:
        return [e.decode("utf-8") for e in tensor.array]
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"input {INPUT!r} holds an element that is not UTF-8 ({e.reason})") from e


def requested_outputs(names: list[str], kind: str) -> list[str]:
    """The outputs to return (all when none is asked for), checked before any work."""
    for name in names:
        if name not in TENSORS[kind]:
            raise InvalidArgument(f"unknown output {quote(name)}; a {kind} model returns {', '.join(TENSORS[kind])}")
    return names or list(TENSORS[kind])


def _texts(texts: list[str]) -> np.ndarray:
    array = np.empty(len(texts), dtype=object)
    array[:] = [t.encode() for t in texts]
    return array
