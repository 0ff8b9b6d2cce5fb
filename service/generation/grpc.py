"""gRPC servicer of GenerationService: validate, convert, delegate, convert back.

`add_to_server` is what service/server.py calls. A generation handle is cancelled in `finally`,
so a client that goes away (cancel, deadline) or a server shutdown frees the sequence's cache row
at the scheduler's next step. A stream gets the chunks that were posted while its previous message
was written joined into one message (text and tokens concatenated, so the joined stream still
equals the unary response): fewer messages when the server is busiest. With
`stream_interval_ms` the stream also waits that long after each message before taking the next
chunks, so a message carries every token of that interval (docs/design/serving-overhead.md: a
message costs grpc.aio ~45 µs of CPU here). Unary Generate waits for the whole generation once
instead of at every step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from service.errors import grpc_errors, label_model
from service.generation import converters
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.registry import ModelRegistry
from service.settings import Settings


class GenerationServicer(pb_grpc.GenerationServiceServicer):
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    async def submit(self, request: pb.GenerateRequest):
        """Admits and queues the generation: (model, handle); raises before any work (HTTP runs this too)."""
        self.registry.admit()
        model = self.registry.get("generation", request.model)
        label_model(model.name)
        converters.stream_interval(request)  # checked for both RPCs, before any work
        return model, await model.submit_async(request.prompt, converters.sampling_params(request))

    @grpc_errors("GenerationService")
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        model, handle = await self.submit(request)
        try:
            chunks = await handle.collect()
        finally:
            handle.cancel()
        return converters.generate_response(chunks, model.name)

    @grpc_errors("GenerationService")
    async def GenerateStream(self, request: pb.GenerateRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateChunk]:
        interval = converters.stream_interval(request)
        model, handle = await self.submit(request)
        try:
            sent = None
            async for chunk in handle:
                if interval and sent is not None and chunk.finish_reason is None:
                    pause = sent + interval - time.monotonic()
                    if pause > 0:
                        await asyncio.sleep(pause)  # the tokens of the pause join this message
                # Chunks posted while the previous message was written (or during the pause) go out as one.
                yield converters.generate_chunk(converters.join_chunks([chunk, *handle.ready()]), model.name)
                sent = time.monotonic()
        finally:
            handle.cancel()


def add_to_server(server: grpc.aio.Server, registry: ModelRegistry, settings: Settings) -> None:
    """Registers GenerationService on server."""
    pb_grpc.add_GenerationServiceServicer_to_server(GenerationServicer(registry), server)
