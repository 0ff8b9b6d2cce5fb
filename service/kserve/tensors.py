"""The Open Inference Protocol's REST tensors: JSON and the binary tensor extension <-> numpy.

A request body is a JSON object, optionally followed by binary tensor data: header
`Inference-Header-Content-Length` gives the JSON's size, and each input sent that way says
`parameters.binary_data_size` instead of `data`; their bytes follow the JSON in input order
(tritonclient.http's default). A tensor's `data` is its elements row-major, flat or nested. BYTES
elements are JSON strings, or in binary a 4-byte little-endian length then the bytes, per element
(`pack_bytes` / `split_bytes`, which the gRPC binding's raw contents use too). An output goes back
binary when its request output says `binary_data: true`, or, for outputs not named, when the
request's `binary_data_output` parameter is true; otherwise as JSON `data`.

Everything here is plain data: a malformed request is `InvalidArgument` naming the field.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import QUOTE_CHARS, InvalidArgument, quote
from service.http.body import TOO_DEEP, too_deep

HEADER_LENGTH = "inference-header-content-length"
DATATYPES = {  # the protocol's tensor datatypes -> numpy (little-endian, as the binary data is)
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
LENGTH = struct.Struct("<I")
MAX_DEPTH = 32  # nesting of the JSON header, as every other HTTP body (service/http/body.py)
Scalar = bool | int | float | str


@dataclass(frozen=True)
class Tensor:
    """One tensor: BYTES as an object array of bytes, any other datatype as its numpy dtype."""

    name: str
    datatype: str
    array: np.ndarray  # shaped as the tensor

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)


@dataclass(frozen=True)
class InferRequest:
    """An inference request's body, decoded. outputs: the names asked for, in order, each with
    whether it goes back binary (empty: every output, binary when `binary_output`)."""

    inputs: list[Tensor]
    outputs: dict[str, bool] = field(default_factory=dict)
    parameters: dict[str, Scalar] = field(default_factory=dict)
    id: str = ""
    binary_output: bool = False


def pack_bytes(elements: Iterable[Any]) -> bytes:
    """BYTES elements (bytes or str) as the protocol's raw layout: a 4-byte LE length, then the bytes."""
    parts: list[bytes] = []
    for element in elements:
        data = element if isinstance(element, bytes) else str(element).encode()
        parts += (LENGTH.pack(len(data)), data)
    return b"".join(parts)


def split_bytes(raw: bytes | memoryview, what: str) -> list[bytes]:
    """The elements of raw BYTES data; InvalidArgument naming `what` when a length runs past the end."""
    raw = memoryview(raw)
    elements, at = [], 0
    while at < len(raw):
        if at + LENGTH.size > len(raw):
            raise InvalidArgument(f"{what}: raw BYTES content is cut inside an element's 4-byte length at byte {at}")
        (size,) = LENGTH.unpack_from(raw, at)
        at += LENGTH.size
        if at + size > len(raw):
            raise InvalidArgument(
                f"{what}: raw BYTES content is cut: an element of {size} bytes at byte {at}, {len(raw) - at} left"
            )
        elements.append(bytes(raw[at : at + size]))
        at += size
    return elements


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """An inference request from its HTTP body and Inference-Header-Content-Length header (or None)."""
    size = _header_size(header_length, len(body))
    header = _json_object(body[:size])
    binary = memoryview(body)[size:]
    inputs, used = [], 0
    for i, spec in enumerate(_list(header, "inputs", required=True)):
        tensor, taken = _input(spec, f"inputs[{i}]", binary[used:])
        inputs.append(tensor)
        used += taken
    if used != len(binary):
        raise InvalidArgument(
            f"{len(binary) - used} bytes of binary data follow the JSON that no input's binary_data_size accounts for"
        )
    parameters = _parameters(header.get("parameters"), "parameters")
    binary_output = parameters.pop("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidArgument(f"parameters.binary_data_output={_shown(binary_output)} must be true or false")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument(f"id must be a string, not {_json_type(request_id)}")
    return InferRequest(inputs, _outputs(header, binary_output), parameters, request_id, binary_output)


def _header_size(header_length: str | None, body_size: int) -> int:
    if header_length is None:
        return body_size
    if not header_length.strip().isdigit() or not 0 < int(header_length) <= body_size:
        raise InvalidArgument(
            f"header Inference-Header-Content-Length={header_length[:32]!r} must be the size "
            f"of the JSON at the start of the body, 1 to {body_size} bytes"
        )
    return int(header_length)


def _json_object(header: bytes | memoryview) -> dict:
    try:
        value = json.loads(bytes(header))
    except RecursionError as e:
        raise InvalidArgument(TOO_DEEP) from e
    except ValueError as e:
        raise InvalidArgument(
            f"the request's JSON is not valid ({e}); with binary tensor data, header "
            "Inference-Header-Content-Length must give the JSON's size"
        ) from e
    if too_deep(bytes(header), MAX_DEPTH):
        raise InvalidArgument(TOO_DEEP)
    if not isinstance(value, dict):
        raise InvalidArgument(f"the request must be a JSON object, not {_json_type(value)}")
    return value


def _list(holder: dict, key: str, required: bool = False, where: str = "") -> list:
    value = holder.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise InvalidArgument(
            f"{where}{key} must be a non-empty array"
            if required
            else f"{where}{key} must be an array, not {_json_type(value)}"
        )
    return value


def _input(spec: Any, where: str, binary: memoryview) -> tuple[Tensor, int]:
    """One request input and how many bytes of the binary data it took."""
    if not isinstance(spec, dict):
        raise InvalidArgument(f"{where} must be an object with name, shape, datatype and data")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}.name must be a non-empty string")
    where = f"{where} ({quote(name)})"
    datatype = spec.get("datatype")
    if datatype not in DATATYPES:
        raise InvalidArgument(f"{where}.datatype={_shown(datatype)} is not one of {', '.join(DATATYPES)}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidArgument(f"{where}.shape={_shown(shape)} must be an array of non-negative integers")
    parameters = _parameters(spec.get("parameters"), f"{where}.parameters")
    if any(key.startswith("shared_memory") for key in parameters):
        raise InvalidArgument(f"{where}: shared memory is not supported here; send the data in the request")
    if "binary_data_size" in parameters:
        size = parameters["binary_data_size"]
        if type(size) is not int or not 0 <= size <= len(binary):
            raise InvalidArgument(
                f"{where}.parameters.binary_data_size={_shown(size)} must be the size of "
                f"its binary data, at most the {len(binary)} bytes left after the JSON"
            )
        return Tensor(name, datatype, from_binary(binary[:size], datatype, shape, where)), size
    if "data" not in spec:
        raise InvalidArgument(f"{where} has neither data nor parameters.binary_data_size")
    return Tensor(name, datatype, _from_json(spec["data"], datatype, shape, where)), 0


def from_binary(raw: memoryview, datatype: str, shape: list[int], where: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        elements = split_bytes(raw, where)
        if len(elements) != count:
            raise InvalidArgument(f"{where}.shape={shape} holds {count} elements but its binary data {len(elements)}")
        array = np.empty(count, dtype=object)
        array[:] = elements
        return array.reshape(shape)
    dtype = DATATYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise InvalidArgument(
            f"{where}.shape={shape} of {datatype} needs {count * dtype.itemsize} bytes but "
            f"its binary_data_size is {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _from_json(data: Any, datatype: str, shape: list[int], where: str) -> np.ndarray:
    flat = _flatten(data)
    count = math.prod(shape)
    if len(flat) != count:
        raise InvalidArgument(f"{where}.shape={shape} holds {count} elements but its data {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InvalidArgument(f"{where}.data: BYTES elements must be JSON strings")
        array = np.empty(count, dtype=object)
        array[:] = [v.encode() for v in flat]
        return array.reshape(shape)
    return numbers(flat, datatype, where).reshape(shape)


def _flatten(data: Any) -> list:
    """Row-major elements of flat or nested arrays (a lone scalar is one element)."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(v, list) for v in data):
        return data
    flat, stack = [], [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def numbers(flat: list, datatype: str, where: str) -> np.ndarray:
    dtype = DATATYPES[datatype]
    if datatype == "BOOL":
        ok = all(type(v) is bool for v in flat)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)  # type: ignore[type-var]  # an integer dtype here
        ok = all(type(v) is int and info.min <= v <= info.max for v in flat)
    else:
        ok = all(type(v) in (int, float) for v in flat)
    if not ok:
        expected = {"BOOL": "true or false"}.get(datatype, f"numbers that fit {datatype}")
        raise InvalidArgument(f"{where}.data: elements must be {expected}")
    with np.errstate(over="ignore"):  # checked below, by the element
        array = np.array(flat, dtype=dtype)
    if dtype.kind == "f" and not np.array_equal(np.isinf(array), np.isinf(np.array(flat, dtype=float))):
        raise InvalidArgument(f"{where}.data: an element is too large for {datatype}")
    return array


def _parameters(value: Any, where: str) -> dict[str, Scalar]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where} must be an object of names to values, not {_json_type(value)}")
    for name, v in value.items():
        if not isinstance(v, Scalar):
            raise InvalidArgument(f"{where}.{name} must be a string, number or boolean, not {_json_type(v)}")
    return dict(value)


def _outputs(header: dict, binary_default: bool) -> dict[str, bool]:
    outputs = {}
    for i, spec in enumerate(_list(header, "outputs")):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidArgument(f"outputs[{i}] must be an object with a string name")
        where = f"outputs[{i}] ({quote(spec['name'])})"
        parameters = _parameters(spec.get("parameters"), f"{where}.parameters")
        unsupported = [k for k in parameters if k.startswith("shared_memory") or k == "classification"]
        if unsupported:
            raise InvalidArgument(f"{where}.parameters.{unsupported[0]} is not supported here")
        binary = parameters.get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise InvalidArgument(f"{where}.parameters.binary_data must be true or false")
        outputs[spec["name"]] = binary
    return outputs


def encode_response(
    model: str, version: str, request: InferRequest, outputs: list[Tensor], parameters: Mapping[str, Scalar]
) -> tuple[bytes, int | None]:
    """The response body and, when outputs go binary, its JSON's size (Inference-Header-Content-Length)."""
    response: dict[str, Any] = {"model_name": model, "model_version": version}
    if request.id:
        response["id"] = request.id
    if parameters:
        response["parameters"] = parameters
    response["outputs"], blobs = [], []
    for tensor in outputs:
        out: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if request.outputs.get(tensor.name, request.binary_output):
            blobs.append(
                pack_bytes(tensor.array.flat)
                if tensor.datatype == "BYTES"
                else np.ascontiguousarray(tensor.array, dtype=DATATYPES[tensor.datatype]).tobytes()
            )
            out["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            out["data"] = _json_data(tensor)
        response["outputs"].append(out)
    header = json.dumps(response, separators=(",", ":")).encode()
    return (header + b"".join(blobs), len(header)) if blobs else (header, None)


def _json_data(tensor: Tensor) -> list:
    if tensor.datatype != "BYTES":
        return tensor.array.ravel().tolist()
    try:
        return [e.decode() if isinstance(e, bytes) else str(e) for e in tensor.array.flat]
    except UnicodeDecodeError as e:
        raise InvalidArgument(
            f"output {quote(tensor.name)} holds bytes that are not UTF-8; ask for it with binary_data: true"
        ) from e


def _shown(value: Any) -> str:
    """A request value for a message: a string quoted, anything else as JSON, bounded either way."""
    if isinstance(value, str):
        return quote(value)
    text = json.dumps(value)
    return text if len(text) <= QUOTE_CHARS else quote(text)


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
