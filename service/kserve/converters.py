"""Open Inference Protocol (KServe v2) tensors and parameters <-> the service's own request messages.

Each served model of a kind in `TENSORS` is one OIP model with one input and typed outputs
(fill-mask models are not: service/kserve/servicer.py answers NOT_FOUND for them):

    every kind   input  text         BYTES [N]     UTF-8 texts
    embedding    output embedding    FP32  [N, D]
    generation   output text_output  BYTES [N]
    translation  output translation  BYTES [N], score FP32 [N]

A ModelInferRequest becomes the inference.v1 request the other servicers take (EmbedRequest,
GenerateRequest per text, TranslateRequest): request parameters are named like that message's
fields (`PARAMETERS`) and set on it, so the v1 converters and the models check their ranges as
they do for every other call. The input travels as `contents.bytes_contents` or as
`raw_input_contents` (what tritonclient sends); outputs always go back raw, as Triton's do: FP32
little-endian, BYTES as a 4-byte little-endian length then the bytes, per element.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from service.converters import float32
from service.errors import InvalidArgument, quote
from service.proto import inference_pb2 as pb
from service.proto import open_inference_grpc_pb2 as oip

INPUT = "text"
VERSION = "1"  # models are not versioned here; "" or "1" both name the served one
TENSORS = {
    "embedding": {"embedding": ("FP32", [-1, -1])},
    "generation": {"text_output": ("BYTES", [-1])},
    "translation": {"translation": ("BYTES", [-1]), "score": ("FP32", [-1])},
}
PARAMETERS = {  # kind -> parameters a request may set: the v1 request's field names
    "embedding": ("normalize", "truncate", "dimensions"),
    "generation": ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "stop", "seed"),
    "translation": ("beam_size", "max_length", "length_penalty"),
}
IGNORED = ("priority", "timeout")  # tritonclient's own; a call here is bounded by its gRPC deadline
LENGTH = struct.Struct("<I")
FP32 = np.dtype("<f4")


@dataclass(frozen=True)
class Output:
    """One output tensor: raw holds its elements as bytes, row-major."""

    name: str
    datatype: str
    shape: list[int]
    raw: bytes


def model_metadata(name: str, kind: str, dimension: int) -> oip.ModelMetadataResponse:
    """The tensors a model of `kind` takes and returns: -1 is any size; an embedding's D is the model's."""
    tensor = oip.ModelMetadataResponse.TensorMetadata
    response = oip.ModelMetadataResponse(name=name, versions=[VERSION], platform=f"transformer-serving/{kind}",
                                         inputs=[tensor(name=INPUT, datatype="BYTES", shape=[-1])])
    for output, (datatype, shape) in TENSORS[kind].items():
        response.outputs.append(tensor(name=output, datatype=datatype, shape=[-1, dimension] if shape == [-1, -1]
                                       else shape))
    return response


def input_texts(request: oip.ModelInferRequest) -> list[str]:
    """The `text` input's elements as strings; INVALID_ARGUMENT naming what is wrong with the tensor."""
    if [t.name for t in request.inputs] != [INPUT]:
        raise InvalidArgument(f"inputs are {[quote(t.name) for t in request.inputs]}; send exactly one input "
                              f"named {INPUT!r} (BYTES, shape [N])")
    tensor = request.inputs[0]
    if tensor.datatype != "BYTES":
        raise InvalidArgument(f"input {INPUT!r} has datatype {quote(tensor.datatype)}; it must be BYTES (UTF-8 texts)")
    if len(tensor.shape) != 1:
        raise InvalidArgument(f"input {INPUT!r} has shape {list(tensor.shape)}; it must be [N], one text per element")
    if request.raw_input_contents:
        if len(request.raw_input_contents) != 1:
            raise InvalidArgument(f"{len(request.raw_input_contents)} raw_input_contents for 1 input; send one")
        elements = _split_raw(request.raw_input_contents[0])
    else:
        elements = list(tensor.contents.bytes_contents)
    if len(elements) != tensor.shape[0]:
        raise InvalidArgument(f"input {INPUT!r} has shape [{tensor.shape[0]}] but {len(elements)} elements")
    if not elements:
        raise InvalidArgument(f"input {INPUT!r} is empty; send at least one text")
    try:
        return [e.decode("utf-8") for e in elements]
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"input {INPUT!r} holds an element that is not UTF-8 ({e.reason})") from e


def _split_raw(raw: bytes) -> list[bytes]:
    """Triton's raw BYTES layout: per element a 4-byte little-endian length, then that many bytes."""
    elements, at = [], 0
    while at < len(raw):
        if at + LENGTH.size > len(raw):
            raise InvalidArgument(f"raw BYTES content is cut inside an element's length at byte {at}")
        (size,) = LENGTH.unpack_from(raw, at)
        at += LENGTH.size
        if at + size > len(raw):
            raise InvalidArgument(f"raw BYTES content is cut: an element of {size} bytes at byte {at}, "
                                  f"{len(raw) - at} left")
        elements.append(raw[at:at + size])
        at += size
    return elements


def requested_outputs(request: oip.ModelInferRequest, kind: str) -> list[str]:
    """The outputs to return (all when none is asked for), checked before any work."""
    names = [o.name for o in request.outputs] or list(TENSORS[kind])
    for name in names:
        if name not in TENSORS[kind]:
            raise InvalidArgument(f"unknown output {quote(name)}; a {kind} model returns {', '.join(TENSORS[kind])}")
    return names


def parameters(request: oip.ModelInferRequest, kind: str) -> dict[str, Any]:
    """The request's parameters as plain values, unknown names refused (a typo must not pass unseen)."""
    values = {}
    for name, param in request.parameters.items():
        if name in IGNORED:
            continue
        if name not in PARAMETERS[kind]:
            raise InvalidArgument(f"unknown parameter {quote(name)} for a {kind} model; accepted: "
                                  f"{', '.join(PARAMETERS[kind])}")
        choice = param.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidArgument(f"parameter {quote(name)} has no value")
        values[name] = getattr(param, choice)
    return values


def fill(message: Message, values: dict[str, Any]) -> Message:
    """Sets each value on the field of the same name; INVALID_ARGUMENT when it does not fit the field."""
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        kind = _KINDS.get(field.cpp_type, "integer")
        try:
            if not isinstance(value, _ACCEPTS[kind]) or (isinstance(value, bool) and kind != "bool"):
                raise TypeError(type(value).__name__)
            if field.is_repeated:  # stop: one sequence per request parameter
                getattr(message, name).append(value)
            else:
                if field.cpp_type == FieldDescriptor.CPPTYPE_FLOAT:  # a double parameter may not fit
                    value = float32(name, float(value))
                setattr(message, name, float(value) if kind == "number" else value)
        except (TypeError, ValueError) as e:  # ValueError: out of the field's range (a negative count)
            expected = "non-negative integer" if kind == "integer" else kind
            raise InvalidArgument(f"parameter {name}={quote(str(value))} does not fit: it must be a {expected}") from e
    return message


_KINDS = {FieldDescriptor.CPPTYPE_BOOL: "bool", FieldDescriptor.CPPTYPE_FLOAT: "number",
          FieldDescriptor.CPPTYPE_DOUBLE: "number", FieldDescriptor.CPPTYPE_STRING: "string"}  # else integer
_ACCEPTS = {"bool": bool, "number": (int, float), "string": str, "integer": int}


def embed_request(texts: list[str], model: str, values: dict[str, Any]) -> pb.EmbedRequest:
    request = pb.EmbedRequest(inputs=texts, model=model, encoding=pb.EMBEDDING_ENCODING_PACKED_FLOAT32)
    return fill(request, values)


def generate_request(text: str, model: str, values: dict[str, Any]) -> pb.GenerateRequest:
    return fill(pb.GenerateRequest(prompt=text, model=model), values)


def translate_request(texts: list[str], model: str, values: dict[str, Any]) -> pb.TranslateRequest:
    return fill(pb.TranslateRequest(inputs=texts, model=model), values)


def embedding_outputs(vectors: np.ndarray) -> list[Output]:
    """(N, D) float32 vectors as the `embedding` output."""
    return [Output("embedding", "FP32", list(vectors.shape), vectors.astype(FP32, copy=False).tobytes())]


def text_output(name: str, texts: list[str]) -> Output:
    return Output(name, "BYTES", [len(texts)], b"".join(LENGTH.pack(len(b)) + b for b in (t.encode() for t in texts)))


def scores_output(scores: list[float]) -> Output:
    return Output("score", "FP32", [len(scores)], np.asarray(scores, dtype=FP32).tobytes())


def infer_response(request: oip.ModelInferRequest, model: str, outputs: list[Output], wanted: list[str],
                   usage: pb.Usage) -> oip.ModelInferResponse:
    """The wanted outputs, raw, in the order asked; token counts as response parameters."""
    by_name = {o.name: o for o in outputs}
    response = oip.ModelInferResponse(model_name=model, model_version=VERSION, id=request.id)
    for name in wanted:
        out = by_name[name]
        response.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        response.raw_output_contents.append(out.raw)
    response.parameters["input_tokens"].int64_param = usage.input_tokens
    response.parameters["output_tokens"].int64_param = usage.output_tokens
    return response
