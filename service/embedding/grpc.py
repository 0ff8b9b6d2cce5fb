"""gRPC servicers of the embedding and model services: validate, convert, delegate, convert back.

Each RPC method is a few lines (MLServer `grpc/servicers.py`): `registry.admit()` (UNAVAILABLE
while draining), `converters` for protobuf <-> plain values, the model backend for the work, and
`@grpc_errors` mapping ServiceError to status codes and counting the call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from service import converters
from service.converters import EmbedParams
from service.errors import InvalidArgument, grpc_errors, label_model
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.registry import ModelRegistry
from service.settings import Settings

STREAM_WINDOW = 8  # EmbedStream: requests of one stream in flight at once (keeps batches full)


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline as a time.monotonic() instant (None: no deadline)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class EmbeddingServicer(pb_grpc.EmbeddingServiceServicer):
    def __init__(self, registry: ModelRegistry, settings: Settings):
        self.registry, self.settings = registry, settings

    @grpc_errors("EmbeddingService")
    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        return await self.embed(request, deadline_of(context))

    async def embed(self, request: pb.EmbedRequest, deadline: float | None) -> pb.EmbedResponse:
        """The call without its gRPC context (HTTP's POST /v1/embeddings runs this too)."""
        self.registry.admit()
        return await self._embed(request, deadline)

    @grpc_errors("EmbeddingService")
    async def EmbedStream(self, requests: AsyncIterator[pb.EmbedRequest],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[pb.EmbedResponse]:
        """One response per request, in order; up to STREAM_WINDOW requests are computed at once."""
        self.registry.admit()
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

    async def _read_stream(self, requests: AsyncIterator[pb.EmbedRequest], window: asyncio.Queue,
                           deadline: float | None) -> None:
        try:
            async for request in requests:
                await window.put(asyncio.create_task(self._embed(request, deadline)))
        finally:
            await window.put(None)  # ends the response loop, which then re-raises a read failure

    async def _embed(self, request: pb.EmbedRequest, deadline: float | None) -> pb.EmbedResponse:
        start = time.perf_counter()
        params = converters.embed_params(request)
        self._validate(params)
        model = self.registry.get("embedding", params.model)
        label_model(model.name)
        result = await model.embed(params.inputs, params.normalize, params.truncate, params.dimensions, deadline)
        return converters.embed_response(result, model.name, params.request_id, time.perf_counter() - start,
                                         params.packed)

    def _validate(self, params: EmbedParams) -> None:
        limit = self.settings.embed_max_inputs
        if not params.inputs:
            raise InvalidArgument("inputs is empty; send at least one text to embed")
        if len(params.inputs) > limit:
            raise InvalidArgument(f"{len(params.inputs)} inputs in one call; the limit is {limit}: "
                                  "split the call (or use EmbedStream)")
        for i, text in enumerate(params.inputs):
            if not text:
                raise InvalidArgument(f"inputs[{i}] is empty; every input must contain text")
