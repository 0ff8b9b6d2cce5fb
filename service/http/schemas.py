"""JSON <-> the cores' values for the HTTP routes: OpenAI's shapes for embeddings and models;
/v1/translate and /v1/fill-mask read and write the JSON of their inference.v1 messages
(json_format), which the kind's converters turn into the core's query.

Only what JSON adds is checked here: types, numbers a float32 field cannot hold (a nonzero one it
would read as 0 is refused: temperature 1e-50 is out of range, not greedy), and the OpenAI fields
this server does not implement (refused, not ignored); the ranges are the core's, as for every
door. `usage` is in every response.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from service.embedding.core import Embeddings, EmbedQuery
from service.errors import InvalidArgument
from service.grpc.packing import WIRE_DTYPE
from service.models import ModelInfo
from service.numbers import float32
from service.proto import inference_pb2 as pb

ENCODING_FORMATS = {"float": pb.EMBEDDING_ENCODING_FLOAT, "base64": pb.EMBEDDING_ENCODING_PACKED_FLOAT32}
_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "an array"}
UINT32, UINT64 = 2**32 - 1, 2**64 - 1  # the proto fields' ranges: beyond them protobuf raises
FLOAT32 = 3.4e38  # a proto float; a larger JSON number would become inf


def field(
    body: dict, name: str, kind: type, default: Any = None, minimum: float | None = None, maximum: float = UINT32
) -> Any:
    """body[name] checked against kind (int accepted for float, bool never for a number); null = absent."""
    value = _checked(body, name, kind, default, minimum, maximum)
    return float32(name, float(value)) if kind is float and value is not None else value


def _checked(body: dict, name: str, kind: type, default: Any, minimum: float | None, maximum: float) -> Any:
    """field() but for the float32 check (a number a 32-bit float would read as 0)."""
    value = body.get(name)
    if value is None:
        return default
    numeric = kind in (int, float)
    ok = isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
    if not ok or (numeric and isinstance(value, bool)):
        raise InvalidArgument(f"{name} must be {_TYPES[kind]} (got {type(value).__name__})")
    if kind is str:
        return text(name, value)
    if not numeric:
        return value
    low = -math.inf if minimum is None else minimum
    if not low <= value <= maximum:  # NaN fails too
        raise InvalidArgument(f"{name}={value} is out of range [{minimum}, {maximum}]")
    return float(value) if kind is float else value


@dataclass(frozen=True)
class Field:
    """One JSON field of a request: its name, type (list: a string or an array of strings, as
    strings(); dict: logit_bias), default (for absent or null) and range."""

    name: str
    kind: type
    default: Any = None
    minimum: float | None = None
    maximum: float = UINT32


PENALTIES = (  # presence_penalty, frequency_penalty, min_p, logit_bias, speculative: SamplingParams fields
    Field("presence_penalty", float, 0.0, minimum=-FLOAT32, maximum=FLOAT32),
    Field("frequency_penalty", float, 0.0, minimum=-FLOAT32, maximum=FLOAT32),
    Field("min_p", float, 0.0, minimum=0, maximum=FLOAT32),
    Field("logit_bias", dict, ()),
    Field("speculative", bool, None),  # an extension: prompt-lookup speculation (None: the server's)
)


def fields(body: dict, table: tuple[Field, ...]) -> dict[str, Any]:
    """Every field of table read from body in the table's order (the first bad one refused), then
    every number checked against its 32-bit float (float32())."""
    values = {f.name: _read(body, f) for f in table}
    for name, number in _floats(body, table, values):
        float32(name, number)
    return values


def _read(body: dict, f: Field) -> Any:
    if f.kind is list:
        return tuple(strings(body, f.name, default=f.default))
    if f.kind is dict:
        return _logit_bias(body)
    return _checked(body, f.name, f.kind, f.default, f.minimum, f.maximum)


def _floats(body: dict, table: tuple[Field, ...], values: dict[str, Any]):
    """(name, value) of every float read: the float fields and logit_bias's biases (named by their key as sent)."""
    for f in table:
        if f.kind is float and values[f.name] is not None:
            yield f.name, values[f.name]
        if f.kind is dict:
            yield from ((f"logit_bias[{key}]", float(bias)) for key, bias in (body.get(f.name) or {}).items())


def text(name: str, value: str) -> str:
    """value, if UTF-8 can carry it (JSON may hold a lone surrogate escape such as \\ud800)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"{name} is not valid Unicode text ({e.reason} at position {e.start})") from e
    return value


def strings(body: dict, name: str, default: list[str] | None = None, most: tuple[int, str] | None = None) -> list[str]:
    """A string or an array of strings as a list (token-id arrays are not accepted); most: (the
    limit, its setting) on the array's length, checked before any element is."""
    value = body.get(name)
    if value is None and default is not None:
        return default
    if isinstance(value, str):
        return [text(name, value)]
    if isinstance(value, list) and most is not None:
        count(name, value, *most)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [text(f"{name}[{i}]", v) for i, v in enumerate(value)]
    raise InvalidArgument(f"{name} must be a string or an array of strings (token-id arrays are not accepted)")


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias {"token id": bias} as (id, bias) pairs (ranges are the core's)."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > 1024:
        raise InvalidArgument("logit_bias must be an object of at most 1024 {token id: bias}")
    out = []
    for key, bias in value.items():
        if not key.isdigit() or isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise InvalidArgument(f"logit_bias[{key[:16]!r}] must map a token id to a number")
        out.append((int(key), float(bias)))
    return tuple(out)


def penalties(body: dict) -> dict:
    """presence_penalty, frequency_penalty, logit_bias and min_p as SamplingParams fields."""
    return fields(body, PENALTIES)


Prompt = str | list[int]


def prompts(value, max_prompts: int) -> list[Prompt]:
    """A completion's prompt: a string, an array of strings, an array of token ids, or an array of
    arrays of token ids. The prompts are counted before any is looked at; token ids are the model's
    to check, after their count (GenerationModel.check_ids): per-element work only within the limits."""
    if isinstance(value, str):
        return [text("prompt", value)]
    if isinstance(value, list) and value:
        if _is_id(value[0]):
            return [value]
        count("prompt", value, max_prompts, "gen_max_queue")
        if all(isinstance(v, str) for v in value):
            return [text(f"prompt[{i}]", v) for i, v in enumerate(value)]
        if all(isinstance(v, list) for v in value):
            return value
    raise InvalidArgument(
        "prompt must be a string, an array of strings, an array of token ids or an array of "
        "arrays of token ids (not empty, not mixed)"
    )


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def count(name: str, values: list, most: int, setting: str) -> None:
    """InvalidArgument when the array `name` holds more than `most` (the setting's value) elements:
    checked on its length, before any work per element."""
    if len(values) > most:
        raise InvalidArgument(f"{name} holds {len(values)} elements; one call takes at most {most} ({setting})")


def refuse_unsupported(body: dict, names: dict[str, Any]) -> None:
    """OpenAI fields this server does not implement: refused unless left at their default value."""
    for name, neutral in names.items():
        if body.get(name) not in (None, neutral):
            raise InvalidArgument(f"{name} is not supported by this server (leave it out or set {neutral!r})")


def embed_request(body: dict, most: int) -> tuple[EmbedQuery, bool]:
    """(the embedding core's query, base64?); most: embed_max_inputs."""
    fmt = field(body, "encoding_format", str, "float")
    if fmt not in ENCODING_FORMATS:
        raise InvalidArgument(f"encoding_format={fmt[:32]!r} is not one of float, base64")
    return EmbedQuery(
        inputs=strings(body, "input", most=(most, "embed_max_inputs")),
        model=field(body, "model", str, ""),
        dimensions=field(body, "dimensions", int, 0, minimum=0),
        prompt_name=field(body, "prompt_name", str, ""),
    ), fmt == "base64"


def embed_response(answer: Embeddings, packed: bool) -> dict:
    """OpenAI's embeddings list; base64 = the packed little-endian float32 bytes (service/grpc/packing.py)."""
    rows = answer.vectors.astype(WIRE_DTYPE, copy=False) if packed else answer.vectors.tolist()
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(row.tobytes()).decode("ascii") if packed else row,
        }
        for i, row in enumerate(rows)
    ]
    tokens = answer.input_tokens
    return {
        "object": "list",
        "data": data,
        "model": answer.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def translate_request(body: dict, most: int) -> pb.TranslateRequest:
    """The JSON form of TranslateRequest (protobuf's JSON mapping; snake_case or camelCase names);
    most: translate_max_inputs."""
    return _parse(body, pb.TranslateRequest(), (most, "translate_max_inputs"))


def fill_mask_request(body: dict, most: int) -> pb.FillMaskRequest:
    """The JSON form of FillMaskRequest (protobuf's JSON mapping, as translate_request); most: embed_max_inputs."""
    return _parse(body, pb.FillMaskRequest(), (most, "embed_max_inputs"))


def _parse(body: dict, message, most: tuple[int, str]):
    """body as `message`, its `inputs` counted first: json_format parses element by element."""
    if isinstance(body.get("inputs"), list):
        count("inputs", body["inputs"], *most)
    for f in message.DESCRIPTOR.fields:  # numbers a 32-bit float would turn into 0
        if f.cpp_type == FieldDescriptor.CPPTYPE_FLOAT and not f.is_repeated:
            for name in {f.name, f.json_name}:
                if isinstance(body.get(name), float):
                    float32(name, body[name])
    try:
        return json_format.ParseDict(body, message)
    except (json_format.ParseError, ValueError) as e:  # ValueError: text UTF-8 cannot carry
        raise InvalidArgument(f"not a {type(message).__name__}: {e}") from e


def message_json(reply) -> dict:
    """A protobuf reply as JSON with every field present (zeros included), proto field names."""
    return json_format.MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def model_json(info: ModelInfo) -> dict:
    return {
        "id": info.name,
        "object": "model",
        "created": 0,
        "owned_by": "transformer-serving",
        "kind": info.kind,
        "is_default": info.is_default,
        "max_input_tokens": info.max_input_tokens,
        "embedding_dimension": info.embedding_dimension,
    }
