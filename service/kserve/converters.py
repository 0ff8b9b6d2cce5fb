"""Open Inference Protocol (KServe v2) protobuf messages <-> the data plane's plain values (dataplane.py).

The input travels as `contents.bytes_contents` (grpcurl, hand-written clients) or as
`raw_input_contents` (what tritonclient sends: per element a 4-byte little-endian length, then
the bytes); outputs always go back raw, as Triton's do: numbers little-endian, BYTES
length-prefixed (tensors.py). Parameters go to the data plane as plain values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.errors import InvalidArgument, quote
from service.kserve.dataplane import INPUT, VERSION, Inference, ModelMetadata
from service.kserve.tensors import DATATYPES, pack_bytes, split_bytes
from service.proto import open_inference_grpc_pb2 as oip


def model_metadata(meta: ModelMetadata) -> oip.ModelMetadataResponse:
    tensor = oip.ModelMetadataResponse.TensorMetadata
    return oip.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions,
        platform=meta.platform,
        inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
        outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
    )


def input_texts(request: oip.ModelInferRequest) -> list[str]:
    """The `text` input's elements as strings; INVALID_ARGUMENT naming what is wrong with the tensor."""
    if [t.name for t in request.inputs] != [INPUT]:
        raise InvalidArgument(
            f"inputs are {[quote(t.name) for t in request.inputs]}; send exactly one input "
            f"named {INPUT!r} (BYTES, shape [N])"
        )
    tensor = request.inputs[0]
    if tensor.datatype != "BYTES":
        raise InvalidArgument(f"input {INPUT!r} has datatype {quote(tensor.datatype)}; it must be BYTES (UTF-8 texts)")
    if len(tensor.shape) != 1:
        raise InvalidArgument(f"input {INPUT!r} has shape {list(tensor.shape)}; it must be [N], one text per element")
    if request.raw_input_contents:
        if len(request.raw_input_contents) != 1:
            raise InvalidArgument(f"{len(request.raw_input_contents)} raw_input_contents for 1 input; send one")
        elements = split_bytes(request.raw_input_contents[0], "raw_input_contents[0]")
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


def parameters(request: oip.ModelInferRequest) -> dict[str, Any]:
    """The request's parameters as plain values (the data plane checks their names)."""
    values = {}
    for name, param in request.parameters.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidArgument(f"parameter {quote(name)} has no value")
        values[name] = getattr(param, choice)
    return values


def infer_response(request: oip.ModelInferRequest, done: Inference) -> oip.ModelInferResponse:
    """The outputs, raw, in the order asked; token counts as response parameters."""
    response = oip.ModelInferResponse(model_name=done.model, model_version=VERSION, id=request.id)
    for tensor in done.outputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(
            pack_bytes(tensor.array.flat)
            if tensor.datatype == "BYTES"
            else np.ascontiguousarray(tensor.array, dtype=DATATYPES[tensor.datatype]).tobytes()
        )
    response.parameters["input_tokens"].int64_param = done.input_tokens
    response.parameters["output_tokens"].int64_param = done.output_tokens
    return response
