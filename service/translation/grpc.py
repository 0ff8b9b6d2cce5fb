"""TranslationService over gRPC: protobuf -> the translation core (service/translation/core.py) -> protobuf."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.translation import converters
from service.translation.core import TranslationCore


class TranslationServicer(pb_grpc.TranslationServiceServicer):
    def __init__(self, core: TranslationCore):
        self.core = core

    @grpc_errors("TranslationService")
    async def Translate(self, request: pb.TranslateRequest, context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        answer = await self.core.translate(converters.translate_query(request), deadline_of(context))
        return converters.translate_response(answer)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_TranslationServiceServicer_to_server(TranslationServicer(cores.translation), server)
