"""Protobuf <-> plain Python values, in one place: servicers call these, engines never see protobuf.

The shared pieces (`usage`, `timings`, `model_info`) are used by every servicer, the generation
and translation ones included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service import packing
from service.embedding import EmbedResult
from service.errors import InvalidArgument
from service.proto import inference_pb2 as pb


@dataclass(frozen=True)
class EmbedParams:
    inputs: list[str]
    model: str
    normalize: bool
    truncate: bool
    dimensions: int
    request_id: str
    packed: bool  # vectors as little-endian float32 bytes (EMBEDDING_ENCODING_PACKED_FLOAT32)


FLOAT32_ZERO = 2.0**-150  # a magnitude at or below this is 0 as a 32-bit float (the smallest one is 2**-149)


def float32(name: str, value: float) -> float:
    """value for a proto `float` field from a door that reads wider numbers (JSON, OIP's double
    parameters); INVALID_ARGUMENT when it is not 0 but a 32-bit float would hold it as 0: a
    temperature of 1e-50 became 0, greedy, instead of being refused as out of range."""
    if value != 0 and abs(value) <= FLOAT32_ZERO:
        raise InvalidArgument(f"{name}={value!r} is too small for the field's 32-bit float, which would read it as 0; "
                              "send 0 or a value in the documented range")
    return value


ENCODINGS = {pb.EMBEDDING_ENCODING_UNSPECIFIED: False, pb.EMBEDDING_ENCODING_FLOAT: False,
             pb.EMBEDDING_ENCODING_PACKED_FLOAT32: True}  # encoding -> packed


def embed_params(request: pb.EmbedRequest) -> EmbedParams:
    """An EmbedRequest as plain values, optional fields resolved to their defaults."""
    if request.encoding not in ENCODINGS:
        raise InvalidArgument(f"encoding={request.encoding} is not an EmbeddingEncoding; use "
                              "EMBEDDING_ENCODING_FLOAT or EMBEDDING_ENCODING_PACKED_FLOAT32")
    return EmbedParams(
        inputs=list(request.inputs),
        model=request.model,
        normalize=request.normalize if request.HasField("normalize") else True,
        truncate=request.truncate if request.HasField("truncate") else True,
        dimensions=int(request.dimensions),
        request_id=request.request_id,
        packed=ENCODINGS[request.encoding],
    )


def usage(input_tokens: int, output_tokens: int = 0) -> pb.Usage:
    return pb.Usage(input_tokens=input_tokens, output_tokens=output_tokens)


def timings(total_s: float, tokenize_s: float = 0.0, queue_s: float = 0.0, inference_s: float = 0.0,
            time_to_first_token_s: float = 0.0) -> pb.Timings:
    """Seconds in, milliseconds out (the proto's unit)."""
    return pb.Timings(tokenize_ms=tokenize_s * 1e3, queue_ms=queue_s * 1e3, inference_ms=inference_s * 1e3,
                      total_ms=total_s * 1e3, time_to_first_token_ms=time_to_first_token_s * 1e3)


def embed_response(result: EmbedResult, model: str, request_id: str, total_s: float,
                   packed: bool = False) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        embeddings=packing.embeddings(result.embeddings, packed),
        model=model,
        usage=usage(result.input_tokens),
        timings=timings(total_s, result.tokenize_s, result.queue_s, result.inference_s),
        request_id=request_id,
    )


def model_info(info: dict[str, Any], is_default: bool) -> pb.ModelInfo:
    """A backend's info() dict (service.registry.model_info) as a ModelInfo message."""
    return pb.ModelInfo(is_default=is_default, **info)
