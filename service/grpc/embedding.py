"""EmbeddingService over gRPC: protobuf -> the embedding core (service/embedding/core.py) -> protobuf.

Each RPC method is a few lines (MLServer `grpc/servicers.py`): the converters below for protobuf <->
plain values (the HTTP and KServe doors use `embed_query` too), the core for validation, admission
and the work, and `@grpc_errors` mapping ServiceError to status codes and counting the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from service.cores import Cores
from service.embedding.core import EmbeddingCore, Embeddings, EmbedQuery
from service.errors import InvalidArgument, deadline_of, grpc_errors
from service.grpc import packing
from service.grpc.converters import timings, usage
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

STREAM_WINDOW = 8  # EmbedStream: requests of one stream in flight at once (keeps batches full)
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
        prompt_name=request.prompt_name,
        prompt=request.prompt if request.HasField("prompt") else None,
    )


def embed_response(answer: Embeddings, request_id: str, packed: bool = False) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        embeddings=packing.embeddings(answer.vectors, packed),
        model=answer.model,
        usage=usage(answer.input_tokens),
        timings=timings(answer.timings),
        request_id=request_id,
    )


class EmbeddingServicer(pb_grpc.EmbeddingServiceServicer):
    def __init__(self, core: EmbeddingCore):
        self.core = core

    @grpc_errors("EmbeddingService")
    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        return await self._embed(request, deadline_of(context))

    @grpc_errors("EmbeddingService")
    async def EmbedStream(
        self, requests: AsyncIterator[pb.EmbedRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EmbedResponse]:
        """One response per request, in order; up to STREAM_WINDOW requests are computed at once."""
        self.core.registry.admit()  # refused while draining; once open, its messages go on through a drain
        window: asyncio.Queue = asyncio.Queue(STREAM_WINDOW)
        reader = asyncio.create_task(self._read_stream(requests, window, deadline_of(context)))
        try:
            while (task := await window.get()) is not None:
                yield await task
            await reader  # re-raises a failure of the request stream itself
        finally:
            reader.cancel()
            while not window.empty():
                if (task := window.get_nowait()) is not None:
                    task.cancel()

    async def _read_stream(
        self, requests: AsyncIterator[pb.EmbedRequest], window: asyncio.Queue, deadline: float | None
    ) -> None:
        try:
            async for request in requests:
                task = asyncio.create_task(self._embed(request, deadline))
                try:
                    await window.put(task)
                except asyncio.CancelledError:  # the client left while the window was full: nobody holds task
                    task.cancel()
                    raise
        finally:
            await window.put(None)  # ends the response loop, which then re-raises a read failure

    async def _embed(self, request: pb.EmbedRequest, deadline: float | None) -> pb.EmbedResponse:
        as_bytes = packed(request)
        answer = await self.core.embed(embed_query(request), deadline)
        return embed_response(answer, request.request_id, as_bytes)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_EmbeddingServiceServicer_to_server(EmbeddingServicer(cores.embedding), server)
