"""gRPC servicer of TranslationService: validate, convert, delegate, convert back."""

from __future__ import annotations

import grpc

from service.errors import grpc_errors, label_model
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.registry import ModelRegistry
from service.settings import Settings
from service.translation import converters


class TranslationServicer(pb_grpc.TranslationServiceServicer):
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    @grpc_errors("TranslationService")
    async def Translate(self, request: pb.TranslateRequest, context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        return await self.translate(request)

    async def translate(self, request: pb.TranslateRequest) -> pb.TranslateResponse:
        """The call without its gRPC context (HTTP's POST /v1/translate runs this too)."""
        self.registry.admit()
        model = self.registry.get("translation", request.model)
        label_model(model.name)
        result = await model.translate(list(request.inputs), converters.translate_options(request))
        return converters.translate_response(result, model.name)


def add_to_server(server: grpc.aio.Server, registry: ModelRegistry, settings: Settings) -> None:
    """Registers TranslationService on server."""
    pb_grpc.add_TranslationServiceServicer_to_server(TranslationServicer(registry), server)
