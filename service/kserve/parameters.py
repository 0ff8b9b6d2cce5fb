"""The Open Inference Protocol's request parameters -> the inference.v1 request of the model's kind.

Parameters are named like the fields of the kind's v1 request (the `PARAMETERS` of its module,
service/kserve/<kind>.py) and set on that message (`fill`), so a value that does not fit the field
(a string temperature, a negative count) is refused here and the v1 converters and models check
ranges as they do for every other door.
Both bindings (gRPC `InferParameter`s, REST JSON values) hand in plain bool / int / float / str.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from service.errors import InvalidArgument, quote
from service.numbers import float32

IGNORED = ("priority", "timeout")  # tritonclient's own; a call here is bounded by its deadline


def checked(parameters: dict[str, Any], accepted: tuple[str, ...], kind: str) -> dict[str, Any]:
    """The parameters a `kind` model takes (`accepted`); an unknown name is refused (a typo must not pass unseen)."""
    values = {}
    for name, value in parameters.items():
        if name in IGNORED:
            continue
        if name not in accepted:
            raise InvalidArgument(
                f"unknown parameter {quote(name)} for a {kind} model; accepted: {', '.join(accepted)}"
            )
        values[name] = value
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
        except (TypeError, ValueError) as e:  # ValueError: out of the field's range (a negative or huge count)
            expected = f"an integer in {_RANGES[field.cpp_type]}" if kind == "integer" else f"a {kind}"
            raise InvalidArgument(f"parameter {name}={quote(str(value))} does not fit: it must be {expected}") from e
    return message


_KINDS = {
    FieldDescriptor.CPPTYPE_BOOL: "bool",
    FieldDescriptor.CPPTYPE_FLOAT: "number",
    FieldDescriptor.CPPTYPE_DOUBLE: "number",
    FieldDescriptor.CPPTYPE_STRING: "string",
}  # else integer
_RANGES = {  # an integer field's range, named in the refusal
    FieldDescriptor.CPPTYPE_INT32: f"[{-(2**31)}, {2**31 - 1}]",
    FieldDescriptor.CPPTYPE_INT64: f"[{-(2**63)}, {2**63 - 1}]",
    FieldDescriptor.CPPTYPE_UINT32: f"[0, {2**32 - 1}]",
    FieldDescriptor.CPPTYPE_UINT64: f"[0, {2**64 - 1}]",
    FieldDescriptor.CPPTYPE_ENUM: "the enum's values",
}
_ACCEPTS: dict[str, Any] = {"bool": bool, "number": (int, float), "string": str, "integer": int}
