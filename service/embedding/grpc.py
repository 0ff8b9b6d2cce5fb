"""EmbeddingService over gRPC: protobuf -> the embedding core (service/embedding/core.py) -> protobuf.

Each RPC method is a few lines (MLServer `grpc/servicers.py`): `converters` for protobuf <-> plain
values, the core for validation, admission and the work, and `@grpc_errors` mapping ServiceError to
status codes and counting the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from service.cores import Cores
from service.embedding import converters
from service.embedding.core import EmbeddingCore
from service.errors import deadline_of, grpc_errors
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

STREAM_WINDOW = 8  # EmbedStream: requests of one stream in flight at once (keeps batches full)


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
        packed = converters.packed(request)
        answer = await self.core.embed(converters.embed_query(request), deadline)
        return converters.embed_response(answer, request.request_id, packed)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_EmbeddingServiceServicer_to_server(EmbeddingServicer(cores.embedding), server)
