"""The Open Inference Protocol's REST tensors: JSON and the binary tensor extension <-> numpy.

A request body is a JSON object, optionally followed by binary tensor data: header
`Inference-Header-Content-Length` gives the JSON's size, and each input sent that way says
`parameters.binary_data_size` instead of `data`; their bytes follow the JSON in input order
(tritonclient.http's default). A tensor's `data` is its elements row-major, flat or nested. BYTES
elements are JSON strings, or in binary a 4-byte little-endian length then the bytes, per element
(`pack_bytes` / `split_bytes`, which the gRPC binding's raw contents use too). An output goes back
binary when its request output says `binary_data: true`, or, for outputs not named, when the
request's `binary_data_output` parameter is true; otherwise as JSON `data`.

Everything here is plain data: a malformed request is `InvalidArgument` naming the field. Work
is bounded before it is done (arrays.py): the JSON's nesting and values are counted before it is
parsed (service/http/body.py), every shape is bounded before it is multiplied, `expect` sees every
input's name, datatype and shape before any element is decoded, and the elements are counted
against the shape before each one is checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import InvalidArgument, quote
from service.http.body import TOO_DEEP, check_structure
from service.kserve.arrays import (
    DATATYPES,
    Expect,
    Scalar,
    Spec,
    Tensor,
    element_count,
    from_binary,
    json_type,
    numbers,
    pack_bytes,
    shown,
)

HEADER_LENGTH = "inference-header-content-length"
_DECIMAL = re.compile(r"[0-9]{1,19}")  # a header's size in ASCII digits (int() takes any Unicode digit)


@dataclass(frozen=True)
class InferRequest:
    """An inference request's body, decoded. outputs: the names asked for, in order, each with
    whether it goes back binary (empty: every output, binary when `binary_output`)."""

    inputs: list[Tensor]
    outputs: dict[str, bool] = field(default_factory=dict)
    parameters: dict[str, Scalar] = field(default_factory=dict)
    id: str = ""
    binary_output: bool = False


def decode_request(body: bytes, header_length: str | None, most: int, expect: Expect | None = None) -> InferRequest:
    """An inference request from its HTTP body and Inference-Header-Content-Length header (or None);
    most: elements a tensor may hold (the server's message size); expect: see Expect."""
    size = _header_size(header_length, len(body))
    header = _json_object(body[:size])
    fields = [_spec(spec, f"inputs[{i}]", most) for i, spec in enumerate(_list(header, "inputs", required=True))]
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument(f"id must be a string, not {json_type(request_id)}")
    parameters = _parameters(header.get("parameters"), "parameters")
    binary_output = parameters.pop("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidArgument(f"parameters.binary_data_output={shown(binary_output)} must be true or false")
    outputs = _outputs(header, binary_output)
    if expect is not None:
        expect([spec for spec, _, _ in fields])
    binary = memoryview(body)[size:]
    inputs, used = [], 0
    for spec, source, where in fields:
        tensor, taken = _input(spec, source, where, binary[used:])
        inputs.append(tensor)
        used += taken
    if used != len(binary):
        raise InvalidArgument(
            f"{len(binary) - used} bytes of binary data follow the JSON that no input's binary_data_size accounts for"
        )
    return InferRequest(inputs, outputs, parameters, _text(request_id, "id"), binary_output)


def _header_size(header_length: str | None, body_size: int) -> int:
    if header_length is None:
        return body_size
    digits = header_length.strip()
    if not _DECIMAL.fullmatch(digits) or not 0 < int(digits) <= body_size:
        raise InvalidArgument(
            f"header Inference-Header-Content-Length={header_length[:32]!r} must be the size "
            f"of the JSON at the start of the body, 1 to {body_size} bytes in decimal digits"
        )
    return int(digits)


def _json_object(header: bytes | memoryview) -> dict:
    check_structure(bytes(header))  # nesting and values bounded as every HTTP body's, before parsing
    try:
        value = json.loads(bytes(header))
    except RecursionError as e:
        raise InvalidArgument(TOO_DEEP) from e
    except ValueError as e:
        raise InvalidArgument(
            f"the request's JSON is not valid ({e}); with binary tensor data, header "
            "Inference-Header-Content-Length must give the JSON's size"
        ) from e
    if not isinstance(value, dict):
        raise InvalidArgument(f"the request must be a JSON object, not {json_type(value)}")
    return value


def _list(holder: dict, key: str, required: bool = False, where: str = "") -> list:
    value = holder.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise InvalidArgument(
            f"{where}{key} must be a non-empty array"
            if required
            else f"{where}{key} must be an array, not {json_type(value)}"
        )
    return value


def _spec(spec: Any, where: str, most: int) -> tuple[Spec, dict, str]:
    """An input's name, datatype and shape, checked (its elements are not looked at), its JSON, and
    how messages name it."""
    if not isinstance(spec, dict):
        raise InvalidArgument(f"{where} must be an object with name, shape, datatype and data")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}.name must be a non-empty string")
    where = f"{where} ({quote(_text(name, f'{where}.name'))})"
    datatype = spec.get("datatype")
    if datatype not in DATATYPES:
        raise InvalidArgument(f"{where}.datatype={shown(datatype)} is not one of {', '.join(DATATYPES)}")
    shape: list[int] = spec.get("shape")  # type: ignore[assignment]  # element_count checks it
    return Spec(name, datatype, shape, element_count(shape, where, most)), spec, where


def _input(spec: Spec, source: dict, where: str, binary: memoryview) -> tuple[Tensor, int]:
    """One request input and how many bytes of the binary data it took."""
    parameters = _parameters(source.get("parameters"), f"{where}.parameters")
    if any(key.startswith("shared_memory") for key in parameters):
        raise InvalidArgument(f"{where}: shared memory is not supported here; send the data in the request")
    if "binary_data_size" in parameters:
        size = parameters["binary_data_size"]
        if type(size) is not int or not 0 <= size <= len(binary):
            raise InvalidArgument(
                f"{where}.parameters.binary_data_size={shown(size)} must be the size of "
                f"its binary data, at most the {len(binary)} bytes left after the JSON"
            )
        return Tensor(spec.name, spec.datatype, from_binary(binary[:size], spec, where)), size
    if "data" not in source:
        raise InvalidArgument(f"{where} has neither data nor parameters.binary_data_size")
    return Tensor(spec.name, spec.datatype, _from_json(source["data"], spec, where)), 0


def _from_json(data: Any, spec: Spec, where: str) -> np.ndarray:
    flat = _flatten(data, spec.count)
    if len(flat) != spec.count:
        shown = f"more than {spec.count}" if len(flat) > spec.count else len(flat)
        raise InvalidArgument(f"{where}.shape={spec.shape} holds {spec.count} elements but its data {shown}")
    if spec.datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InvalidArgument(f"{where}.data: BYTES elements must be JSON strings")
        array = np.empty(spec.count, dtype=object)
        try:
            array[:] = [v.encode() for v in flat]
        except UnicodeEncodeError:
            for i, v in enumerate(flat):
                _text(v, f"{where}.data[{i}]")  # raises, naming the first element UTF-8 cannot carry
            raise
        return array.reshape(spec.shape)
    return numbers(flat, spec.datatype, where).reshape(spec.shape)


def _flatten(data: Any, count: int) -> list:
    """Row-major elements of flat or nested arrays (a lone scalar is one element); past `count`
    elements it stops, one over."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(v, list) for v in data):
        return data
    flat: list = []
    stack = [iter(data)]
    while stack and len(flat) <= count:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def _parameters(value: Any, where: str) -> dict[str, Scalar]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where} must be an object of names to values, not {json_type(value)}")
    for name, v in value.items():
        _text(name, f"{where} name {quote(name)}")
        if not isinstance(v, Scalar):
            raise InvalidArgument(f"{where}.{name} must be a string, number or boolean, not {json_type(v)}")
        if isinstance(v, str):
            _text(v, f"{where}.{name}")
    return dict(value)


def _outputs(header: dict, binary_default: bool) -> dict[str, bool]:
    outputs = {}
    for i, spec in enumerate(_list(header, "outputs")):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidArgument(f"outputs[{i}] must be an object with a string name")
        where = f"outputs[{i}] ({quote(_text(spec['name'], f'outputs[{i}].name'))})"
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


def _text(value: str, where: str) -> str:
    """value, if UTF-8 can carry it (a JSON string may hold a lone surrogate escape such as \\ud800)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"{where} is not valid Unicode text ({e.reason} at position {e.start})") from e
    return value
