"""InspectionService over gRPC: protobuf -> the attention core (service/inspection/core.py) -> protobuf."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.inspection import converters
from service.inspection.core import AttentionCore
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc


class InspectionServicer(pb_grpc.InspectionServiceServicer):
    def __init__(self, core: AttentionCore):
        self.core = core

    @grpc_errors("InspectionService")
    async def Attention(self, request: pb.AttentionRequest, context: grpc.aio.ServicerContext) -> pb.AttentionResponse:
        answer = await self.core.attention(converters.attention_query(request), deadline_of(context))
        return converters.attention_response(answer)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_InspectionServiceServicer_to_server(InspectionServicer(cores.attention), server)
