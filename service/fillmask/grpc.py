"""FillMaskService: validate, delegate to the fill-mask model, convert back (as EmbeddingService does).

The same limits as Embed (`embed_max_inputs` inputs per call; the model's queue, batches and
deadlines are the embedding batcher's); the model checks masks and top_k (service/fillmask/model.py).
A response over `max_message_bytes` is refused with INVALID_ARGUMENT rather than left to fail in
transport.
"""

from __future__ import annotations

import time

import grpc

from service.embedding.grpc import deadline_of
from service.errors import InvalidArgument, grpc_errors, label_model
from service.fillmask import converters
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.registry import ModelRegistry
from service.settings import Settings

SERVICE = "FillMaskService"


class FillMaskServicer(pb_grpc.FillMaskServiceServicer):
    def __init__(self, registry: ModelRegistry, settings: Settings):
        self.registry, self.settings = registry, settings

    @grpc_errors(SERVICE)
    async def FillMask(self, request: pb.FillMaskRequest, context: grpc.aio.ServicerContext) -> pb.FillMaskResponse:
        return await self.fill_mask(request, deadline_of(context))

    async def fill_mask(self, request: pb.FillMaskRequest, deadline: float | None) -> pb.FillMaskResponse:
        """The call without its gRPC context (HTTP's POST /v1/fill-mask runs this too)."""
        self.registry.admit()
        start = time.perf_counter()
        inputs = list(request.inputs)
        self._validate(inputs)
        model = self.registry.get("fill-mask", request.model)
        label_model(model.name)
        result = await model.fill(inputs, int(request.top_k), deadline)
        response = converters.fill_mask_response(result, model.name, time.perf_counter() - start)
        size, limit = response.ByteSize(), self.settings.max_message_bytes
        if size > limit:
            raise InvalidArgument(f"the response would be {size} bytes, over the server's limit of {limit} "
                                  "(max_message_bytes): lower top_k or split the call")
        return response

    def _validate(self, inputs: list[str]) -> None:
        limit = self.settings.embed_max_inputs
        if not inputs:
            raise InvalidArgument("inputs is empty; send at least one text holding a [MASK]")
        if len(inputs) > limit:
            raise InvalidArgument(f"{len(inputs)} inputs in one call; the limit is {limit}: split the call")
        for i, text in enumerate(inputs):
            if not text:
                raise InvalidArgument(f"inputs[{i}] is empty; every input must contain text with a [MASK]")


def add_to_server(server: grpc.aio.Server, registry: ModelRegistry, settings: Settings) -> FillMaskServicer:
    servicer = FillMaskServicer(registry, settings)
    pb_grpc.add_FillMaskServiceServicer_to_server(servicer, server)
    return servicer
