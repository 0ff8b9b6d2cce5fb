"""gRPC servicer of ModelService: the served models' ModelInfo, from the registry."""

from __future__ import annotations

import grpc

from service import converters
from service.cores import Cores
from service.errors import InvalidArgument, grpc_errors, label_model
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.registry import ModelRegistry


class ModelServicer(pb_grpc.ModelServiceServicer):
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    @grpc_errors("ModelService")
    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        self.registry.admit()
        return pb.ListModelsResponse(models=[self._info(b) for b in self.registry])

    @grpc_errors("ModelService")
    async def GetModel(self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        self.registry.admit()
        if not request.name:
            raise InvalidArgument("name is empty; pass a model name (ListModels lists them)")
        backend = self.registry.find(request.name)
        label_model(backend.name)
        return self._info(backend)

    def _info(self, backend) -> pb.ModelInfo:
        return converters.model_info(backend.info(), self.registry.is_default(backend))


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_ModelServiceServicer_to_server(ModelServicer(cores.registry), server)
