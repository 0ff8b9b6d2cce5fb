"""Open Inference Protocol (KServe v2) protobuf messages <-> the data plane's plain values (dataplane.py).

The input travels as `contents.bytes_contents` (grpcurl, hand-written clients) or as
`raw_input_contents` (what tritonclient sends: per element a 4-byte little-endian length, then
the bytes); either way it becomes the plain `tensors.Tensor` the REST binding decodes, which the
data plane checks for both. Outputs always go back raw, as Triton's do: numbers little-endian, BYTES
length-prefixed (tensors.py). Parameters go to the data plane as plain values.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.errors import InvalidArgument, quote
from service.kserve.dataplane import VERSION, Inference, ModelMetadata
from service.kserve.tensors import DATATYPES, Tensor, from_binary, numbers, pack_bytes
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


CONTENTS = {  # datatype -> its InferTensorContents field (FP16 travels only raw)
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def input_tensors(request: oip.ModelInferRequest) -> list[Tensor]:
    """The request's inputs as the plain tensors the REST binding decodes too (the data plane's
    `input_texts` then checks them for both); INVALID_ARGUMENT naming the input that is malformed."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one per input")
    decoded = []
    for i, tensor in enumerate(request.inputs):
        where, shape = f"inputs[{i}] ({quote(tensor.name)})", list(tensor.shape)
        if tensor.datatype not in DATATYPES:
            raise InvalidArgument(f"{where}.datatype={quote(tensor.datatype)} is not one of {', '.join(DATATYPES)}")
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"{where}.shape={shape} must hold non-negative sizes")
        if raw:
            array = from_binary(memoryview(raw[i]), tensor.datatype, shape, where)
        else:
            array = _from_contents(tensor.contents, tensor.datatype, shape, where)
        decoded.append(Tensor(tensor.name, tensor.datatype, array))
    return decoded


def _from_contents(contents: oip.InferTensorContents, datatype: str, shape: list[int], where: str) -> np.ndarray:
    if datatype not in CONTENTS:
        raise InvalidArgument(f"{where}: {datatype} travels only in raw_input_contents")
    values, count = list(getattr(contents, CONTENTS[datatype])), math.prod(shape)
    if len(values) != count:
        raise InvalidArgument(f"{where}.shape={shape} holds {count} elements but its contents {len(values)}")
    if datatype != "BYTES":
        return numbers(values, datatype, where).reshape(shape)
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(shape)


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
