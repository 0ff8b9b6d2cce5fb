"""The Open Inference Protocol's tensors as numpy arrays, whichever binding brought them.

`Tensor` is one decoded tensor (BYTES as an object array of bytes); `Spec` an input's name,
datatype, shape and element count, checked before any element is decoded, so that a binding can
let the data plane refuse the inputs (`Expect`) before it spends work on them. `element_count`
bounds a shape before multiplying it: at most MAX_DIMS dimensions whose non-zero ones multiply to
at most the server's message size (no element takes less than a byte), the product stopped as
soon as it passes that, never computed as an unbounded integer. Raw BYTES data (tritonclient's
binary layout, shared by the REST binary extension and gRPC's raw contents) is per element a
4-byte little-endian length then the bytes (`pack_bytes` / `split_bytes`); `from_binary` compares
sizes before it reads an element, `numbers` checks JSON or protobuf numbers against a datatype.
A malformed tensor is `InvalidArgument` naming the field.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.errors import QUOTE_CHARS, InvalidArgument, quote

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
MAX_DIMS = 64  # dimensions of a tensor: numpy's limit
Scalar = bool | int | float | str


@dataclass(frozen=True)
class Spec:
    """An input's name, datatype and shape, checked before any of its elements is decoded."""

    name: str
    datatype: str
    shape: list[int]
    count: int  # elements the shape holds


Expect = Callable[[list[Spec]], None]  # the caller's rules on the inputs, before their elements


@dataclass(frozen=True)
class Tensor:
    """One tensor: BYTES as an object array of bytes, any other datatype as its numpy dtype."""

    name: str
    datatype: str
    array: np.ndarray  # shaped as the tensor

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)


def pack_bytes(elements: Iterable[Any]) -> bytes:
    """BYTES elements (bytes or str) as the protocol's raw layout: a 4-byte LE length, then the bytes."""
    parts: list[bytes] = []
    for element in elements:
        data = element if isinstance(element, bytes) else str(element).encode()
        parts += (LENGTH.pack(len(data)), data)
    return b"".join(parts)


def split_bytes(raw: bytes | memoryview, what: str, count: int | None = None) -> list[bytes]:
    """The elements of raw BYTES data; InvalidArgument naming `what` when a length runs past the end or,
    given `count`, as soon as the data holds more elements than that."""
    raw = memoryview(raw)
    elements: list[bytes] = []
    at = 0
    while at < len(raw):
        if count is not None and len(elements) == count:
            raise InvalidArgument(f"{what}: its raw BYTES content holds more than the shape's {count} elements")
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


def element_count(shape: Any, where: str, most: int) -> int:
    """The elements `shape` holds: at most MAX_DIMS non-negative integer dimensions whose non-zero ones
    multiply to at most `most` (the server's message size: no element takes less than a byte), the
    product stopped as soon as it passes that; InvalidArgument naming `where` otherwise."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise InvalidArgument(f"{where}.shape must be an array of at most {MAX_DIMS} dimensions")
    if not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidArgument(f"{where}.shape={shown(shape)} must be an array of non-negative integers")
    product = 1
    for d in shape:
        product *= d or 1
        if product > most:
            raise InvalidArgument(
                f"{where}.shape={shown(shape)} holds more than {most} elements, more than a request "
                "to this server can carry (max_message_bytes)"
            )
    return 0 if 0 in shape else product


def from_binary(raw: memoryview, spec: Spec, where: str) -> np.ndarray:
    """The tensor `spec` describes from its raw bytes: sizes compared before any element is read."""
    if spec.datatype == "BYTES":
        if len(raw) < LENGTH.size * spec.count:  # before any element is split off
            raise InvalidArgument(
                f"{where}.shape={spec.shape} holds {spec.count} elements but its binary data "
                f"{len(raw) // LENGTH.size} at most ({len(raw)} bytes, each element's length taking {LENGTH.size})"
            )
        elements = split_bytes(raw, where, spec.count)
        if len(elements) != spec.count:
            raise InvalidArgument(
                f"{where}.shape={spec.shape} holds {spec.count} elements but its binary data {len(elements)}"
            )
        array = np.empty(spec.count, dtype=object)
        array[:] = elements
        return array.reshape(spec.shape)
    dtype = DATATYPES[spec.datatype]
    if len(raw) != spec.count * dtype.itemsize:
        raise InvalidArgument(
            f"{where}.shape={spec.shape} of {spec.datatype} needs {spec.count * dtype.itemsize} bytes but "
            f"its binary_data_size is {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(spec.shape)


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
    too_large = InvalidArgument(f"{where}.data: an element is too large for {datatype}")
    try:
        with np.errstate(over="ignore"):  # checked below, by the element
            array = np.array(flat, dtype=dtype)
        if dtype.kind == "f" and not np.array_equal(np.isinf(array), np.isinf(np.array(flat, dtype=float))):
            raise too_large
    except OverflowError as e:  # an integer beyond float64's range
        raise too_large from e
    return array


def shown(value: Any) -> str:
    """A request value for a message: a string quoted, anything else as JSON, bounded either way."""
    if isinstance(value, str):
        return quote(value)
    text = json.dumps(value)
    return text if len(text) <= QUOTE_CHARS else quote(text)


def json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
