"""gRPC servicer of ModelService: the models core's ModelInfo (service/models.py) as messages."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import grpc_errors
from service.grpc import converters
from service.models import ModelsCore
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc


class ModelServicer(pb_grpc.ModelServiceServicer):
    def __init__(self, models: ModelsCore):
        self.models = models

    @grpc_errors("ModelService")
    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[converters.model_info(i) for i in self.models.list()])

    @grpc_errors("ModelService")
    async def GetModel(self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        return converters.model_info(self.models.get(request.name))


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_ModelServiceServicer_to_server(ModelServicer(cores.models), server)
