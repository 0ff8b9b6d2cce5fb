"""`inference.GRPCInferenceService`, the Open Inference Protocol (KServe v2) over gRPC, on the service's port.

Each RPC converts the protobuf message (converters.py) to a call of the data plane (dataplane.py),
which the REST binding (rest.py) calls too: the same cores as the v1 doors, so the same admission,
validation, batching, errors (`@grpc_errors`) and metrics (service "GRPCInferenceService").
`tritonclient.grpc` works against it unchanged.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.kserve import converters, repository
from service.kserve.dataplane import SERVER_NAME, DataPlane, input_texts, server_version
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc

SERVICE = "GRPCInferenceService"
SERVICE_NAME = oip.DESCRIPTOR.services_by_name[SERVICE].full_name  # inference.GRPCInferenceService


class InferenceServicer(oip_grpc.GRPCInferenceServiceServicer):
    def __init__(self, plane: DataPlane):
        self.plane = plane

    @grpc_errors(SERVICE)
    async def ServerLive(self, request, context: grpc.aio.ServicerContext) -> oip.ServerLiveResponse:
        return oip.ServerLiveResponse(live=True)

    @grpc_errors(SERVICE)
    async def ServerReady(self, request, context: grpc.aio.ServicerContext) -> oip.ServerReadyResponse:
        return oip.ServerReadyResponse(ready=self.plane.ready())

    @grpc_errors(SERVICE)
    async def ModelReady(self, request, context: grpc.aio.ServicerContext) -> oip.ModelReadyResponse:
        return oip.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

    @grpc_errors(SERVICE)
    async def ServerMetadata(self, request, context: grpc.aio.ServicerContext) -> oip.ServerMetadataResponse:
        return oip.ServerMetadataResponse(name=SERVER_NAME, version=server_version())

    @grpc_errors(SERVICE)
    async def ModelMetadata(self, request, context: grpc.aio.ServicerContext) -> oip.ModelMetadataResponse:
        return converters.model_metadata(self.plane.model_metadata(request.name, request.version))

    @grpc_errors(SERVICE)
    async def ModelInfer(
        self, request: oip.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelInferResponse:
        model = self.plane.admit(request.model_name, request.model_version)
        expect = self.plane.expect_texts(model)
        texts = input_texts(converters.input_tensors(request, self.plane.settings.max_message_bytes, expect))
        outputs, values = [o.name for o in request.outputs], converters.parameters(request)
        done = await self.plane.infer(model, texts, outputs, values, deadline_of(context))
        return converters.infer_response(request, done)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    """Registers GRPCInferenceService on server, with Triton's RepositoryIndex beside it (repository.py)."""
    plane = DataPlane(cores)
    oip_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), server)
    repository.register(server, plane)


def reflection_pool(*files: FileDescriptor) -> descriptor_pool.DescriptorPool:
    """One pool holding `files` and what they import, for server reflection: the OIP file lives in a
    pool of its own (service/protogen.py), which reflection over the default pool would not see."""
    pool = descriptor_pool.DescriptorPool()

    def add(file: FileDescriptor) -> None:
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            for dependency in file.dependencies:
                add(dependency)
            pool.AddSerializedFile(file.serialized_pb)

    for file in files:
        add(file)
    return pool
