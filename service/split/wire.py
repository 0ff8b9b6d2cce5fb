"""The messages between front ends and the engine core, as msgspec structs over pyzmq.

A front end's DEALER socket talks to the engine's ROUTER. Every message is one msgpack array whose
first element names its struct (msgspec's tagged union). A core call carries its query as raw
msgpack, decoded on the engine with the type its (core, method) names in `CALLS`; an embedding call
arrives tokenized (`Embed`) and goes straight into the model's batcher; results, chunks
and errors come back in one `Batch` per engine loop turn and front end (one per decode step, never
one per token). numpy arrays travel as raw bytes with their dtype and shape (msgpack extension 1);
errors as the gRPC status name of their `ServiceError` class and its message.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from service.classification.core import Classified, ClassifyQuery, RerankQuery, Scored, ScoreQuery
from service.errors import ServiceError
from service.fillmask.core import FilledMasks, FillMaskQuery
from service.generation.output import Chunk
from service.generation.query import GenerateQuery
from service.inspection.core import AttentionMaps, AttentionQuery
from service.sparse.core import SparseEmbeddings, SparseQuery
from service.translation.core import TranslateQuery, Translations

ARRAY_EXT = 1
# (core attribute of service/cores.py Cores, method) -> (query type, result type): every unary core
# call a door makes; the engine decodes a Call's query with the first, the front end its answer with the second.
CALLS: dict[tuple[str, str], tuple[type, type]] = {
    ("translation", "translate"): (TranslateQuery, Translations),
    ("fill_mask", "fill_mask"): (FillMaskQuery, FilledMasks),
    ("classification", "rerank"): (RerankQuery, Scored),
    ("classification", "score"): (ScoreQuery, Scored),
    ("classification", "classify"): (ClassifyQuery, Classified),
    ("attention", "attention"): (AttentionQuery, AttentionMaps),
    ("sparse", "embed_sparse"): (SparseQuery, SparseEmbeddings),
}


class Hello(msgspec.Struct, tag=True, array_like=True):
    """Front end -> engine, at start and after the engine restarted: who it is (its pid)."""

    pid: int


class Call(msgspec.Struct, tag=True, array_like=True):
    """A unary core call: `epoch` is the engine pid the front end addressed (a restarted engine drops
    what was meant for its predecessor); `deadline` a time.monotonic() instant (one clock per host)."""

    epoch: int
    id: int
    core: str
    method: str
    query: msgspec.Raw
    deadline: float | None


class Generate(msgspec.Struct, tag=True, array_like=True):
    """GenerationCore.generate_many; the answer names one generation id per query."""

    epoch: int
    id: int
    queries: list[GenerateQuery]
    deadline: float | None


class Embed(msgspec.Struct, tag=True, array_like=True):
    """An embedding call checked and tokenized by the front end: its inputs' token ids and token type
    ids, for model `model` (a served name). The engine takes their queue places and queues them in the
    model's batcher (no task, no tokenizer); answered by `Embedded`, or a `Failure`."""

    epoch: int
    id: int
    model: str
    ids: list[list[int]]
    type_ids: list[list[int]]
    deadline: float | None


class Embedded(msgspec.Struct, array_like=True):
    """An `Embed`'s pooled rows, not normalised (the front end truncates and normalises), and where
    its time went in the engine."""

    id: int
    rows: np.ndarray  # (N, C) float32, in input order
    input_tokens: int
    queue_s: float
    inference_s: float


class Pull(msgspec.Struct, tag=True, array_like=True):
    """Starts sending a generation: its chunks as they come ("stream") or every choice at its end ("collect")."""

    id: int
    collect: bool


class Cancel(msgspec.Struct, tag=True, array_like=True):
    """The caller went away: a call's task is cancelled, a generation's rows freed at the next step."""

    id: int


class Welcome(msgspec.Struct, tag=True, array_like=True):
    """Engine -> front end, the answer to Hello: its pid and what it serves (`Served` per model)."""

    pid: int
    models: list[Served]
    defaults: dict[str, str]


class Served(msgspec.Struct, array_like=True):
    """One model as a front end needs it: its info (ModelInfo fields), its directory, and for a
    generation model what validation, chat rendering and tokenizing read (service/split/models.py)."""

    name: str
    kind: str
    provider: str
    variant: str
    info: dict[str, Any]
    path: str
    generation: dict[str, Any] | None = None
    embedding: dict[str, Any] | None = None  # an embedding model's queue capacity (max_queue)


class Result(msgspec.Struct, array_like=True):
    id: int
    value: msgspec.Raw


class Failure(msgspec.Struct, array_like=True):
    id: int
    code: str  # a grpc.StatusCode name; INTERNAL for a bug (logged by the engine)
    message: str


class Started(msgspec.Struct, array_like=True):
    """A Generate admitted: one (generation id, model, n, stream interval s) per query."""

    id: int
    generations: list[tuple[int, str, int, float]]


class Batch(msgspec.Struct, tag=True, array_like=True):
    """Engine -> one front end, once per loop turn: what became ready for it."""

    results: list[Result] = []
    embedded: list[Embedded] = []
    failures: list[Failure] = []
    started: list[Started] = []
    chunks: list[tuple[int, Chunk]] = []  # (generation id, the chunks joined since its last message)
    collected: list[tuple[int, list[Chunk]]] = []  # (generation id, one joined chunk per choice)


ToEngine = Hello | Call | Embed | Generate | Pull | Cancel
ToFrontend = Welcome | Batch


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        header = msgspec.msgpack.encode((obj.dtype.str, obj.shape))
        return msgspec.msgpack.Ext(ARRAY_EXT, len(header).to_bytes(4, "little") + header + obj.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot send {type(obj).__name__} to another process")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != ARRAY_EXT:
        raise ValueError(f"unknown msgpack extension {code}")
    size = int.from_bytes(data[:4], "little")
    dtype, shape = msgspec.msgpack.decode(data[4 : 4 + size])
    return np.frombuffer(data[4 + size :], dtype=np.dtype(dtype)).reshape(shape).copy()


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is np.ndarray and isinstance(obj, np.ndarray):
        return obj
    raise NotImplementedError(f"cannot decode {kind.__name__}")


ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)


def decoder(kind: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind, ext_hook=_ext_hook, dec_hook=_dec_hook)


TO_ENGINE, TO_FRONTEND = decoder(ToEngine), decoder(ToFrontend)
QUERIES = {key: decoder(query) for key, (query, _) in CALLS.items()}
RESULTS = {key: decoder(result) for key, (_, result) in CALLS.items()}


def error_of(code: str, message: str) -> Exception:
    """The exception a Failure stands for: its ServiceError class, or for INTERNAL a plain error
    (the door answers it as the bug it is)."""
    for cls in _service_errors(ServiceError):
        if cls.code.name == code:
            return cls(message)
    return RuntimeError(f"the engine failed: {message}")


def _service_errors(cls: type[ServiceError]) -> list[type[ServiceError]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_service_errors(sub)]
    return out
