"""EmbedRequest / EmbedResponse <-> the embedding core's plain values (service/embedding/core.py)."""

from __future__ import annotations

from service import packing
from service.converters import timings, usage
from service.embedding.core import Embeddings, EmbedQuery
from service.errors import InvalidArgument
from service.proto import inference_pb2 as pb

ENCODINGS = {
    pb.EMBEDDING_ENCODING_UNSPECIFIED: False,
    pb.EMBEDDING_ENCODING_FLOAT: False,
    pb.EMBEDDING_ENCODING_PACKED_FLOAT32: True,
}  # encoding -> packed


def packed(request: pb.EmbedRequest) -> bool:
    """Whether the reply's vectors go as little-endian float32 bytes (EMBEDDING_ENCODING_PACKED_FLOAT32)."""
    if request.encoding not in ENCODINGS:
        raise InvalidArgument(
            f"encoding={request.encoding} is not an EmbeddingEncoding; use "
            "EMBEDDING_ENCODING_FLOAT or EMBEDDING_ENCODING_PACKED_FLOAT32"
        )
    return ENCODINGS[request.encoding]


def embed_query(request: pb.EmbedRequest) -> EmbedQuery:
    """An EmbedRequest as plain values, optional fields resolved to their defaults."""
    return EmbedQuery(
        inputs=list(request.inputs),
        model=request.model,
        normalize=request.normalize if request.HasField("normalize") else True,
        truncate=request.truncate if request.HasField("truncate") else True,
        dimensions=int(request.dimensions),
    )


def embed_response(answer: Embeddings, request_id: str, packed: bool = False) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        embeddings=packing.embeddings(answer.vectors, packed),
        model=answer.model,
        usage=usage(answer.input_tokens),
        timings=timings(answer.total_s, answer.tokenize_s, answer.queue_s, answer.inference_s),
        request_id=request_id,
    )
