"""FillMaskService over gRPC: protobuf -> the fill-mask core (service/fillmask/core.py) -> protobuf."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.fillmask import converters
from service.fillmask.core import FillMaskCore
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

SERVICE = "FillMaskService"


class FillMaskServicer(pb_grpc.FillMaskServiceServicer):
    def __init__(self, core: FillMaskCore, max_bytes: int):
        self.core, self.max_bytes = core, max_bytes

    @grpc_errors(SERVICE)
    async def FillMask(self, request: pb.FillMaskRequest, context: grpc.aio.ServicerContext) -> pb.FillMaskResponse:
        answer = await self.core.fill_mask(converters.fill_mask_query(request), deadline_of(context))
        return converters.fill_mask_response(answer, self.max_bytes)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    servicer = FillMaskServicer(cores.fill_mask, cores.settings.max_message_bytes)
    pb_grpc.add_FillMaskServiceServicer_to_server(servicer, server)
