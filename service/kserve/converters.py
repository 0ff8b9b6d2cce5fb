"""Open Inference Protocol (KServe v2) protobuf messages <-> the data plane's plain values (dataplane.py).

The input travels as `contents.bytes_contents` (grpcurl, hand-written clients) or as
`raw_input_contents` (what tritonclient sends: per element a 4-byte little-endian length, then
the bytes); either way it becomes the plain `arrays.Tensor` the REST binding decodes, which the
data plane checks for both. Outputs always go back raw, as Triton's do: numbers little-endian, BYTES
length-prefixed (arrays.py). Parameters go to the data plane as plain values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.errors import InvalidArgument, quote
from service.kserve.arrays import DATATYPES, Expect, Spec, Tensor, element_count, from_binary, numbers, pack_bytes
from service.kserve.dataplane import VERSION, Inference, ModelMetadata
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


def input_tensors(request: oip.ModelInferRequest, most: int, expect: Expect | None = None) -> list[Tensor]:
    """The request's inputs as the plain tensors the REST binding decodes too; most: elements a tensor
    may hold (the server's message size); expect: the caller's rules on every input's name, datatype
    and shape, before any element is decoded. INVALID_ARGUMENT naming the input that is malformed."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one per input")
    specs = []
    for i, tensor in enumerate(request.inputs):
        where = f"inputs[{i}] ({quote(tensor.name)})"
        if tensor.datatype not in DATATYPES:
            raise InvalidArgument(f"{where}.datatype={quote(tensor.datatype)} is not one of {', '.join(DATATYPES)}")
        shape = list(tensor.shape)
        specs.append(Spec(tensor.name, tensor.datatype, shape, element_count(shape, where, most)))
    if expect is not None:
        expect(specs)
    decoded = []
    for i, (spec, tensor) in enumerate(zip(specs, request.inputs, strict=True)):
        where = f"inputs[{i}] ({quote(tensor.name)})"
        array = from_binary(memoryview(raw[i]), spec, where) if raw else _from_contents(tensor.contents, spec, where)
        decoded.append(Tensor(tensor.name, tensor.datatype, array))
    return decoded


def _from_contents(contents: oip.InferTensorContents, spec: Spec, where: str) -> np.ndarray:
    if spec.datatype not in CONTENTS:
        raise InvalidArgument(f"{where}: {spec.datatype} travels only in raw_input_contents")
    values = getattr(contents, CONTENTS[spec.datatype])
    if len(values) != spec.count:  # counted before any element is copied
        raise InvalidArgument(f"{where}.shape={spec.shape} holds {spec.count} elements but its contents {len(values)}")
    if spec.datatype != "BYTES":
        return numbers(list(values), spec.datatype, where).reshape(spec.shape)
    array = np.empty(spec.count, dtype=object)
    array[:] = list(values)
    return array.reshape(spec.shape)


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
