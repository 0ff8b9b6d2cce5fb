"""Triton's `RepositoryIndex` RPC beside the Open Inference Protocol's, so tritonclient.grpc lists the models.

The protocol itself has no call that lists models; Triton's extension (`get_model_repository_index`
in tritonclient, over gRPC and REST) does, and clients walk the repository with it. Its two
messages are not in the vendored OIP file, and Triton's own file cannot load beside it (same
package, same message names: docs/design/kserve.md), so they are declared here field for field
(name, number and type as Triton's `grpc_service.proto`; a test parses the answer with
tritonclient's own classes) in a private descriptor pool, and the method is served by a generic
handler under the same service name.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from service.errors import grpc_errors
from service.kserve.dataplane import DataPlane

SERVICE = "GRPCInferenceService"
FULL_NAME = f"inference.{SERVICE}"
_F = descriptor_pb2.FieldDescriptorProto


def _message_classes() -> tuple[type[Message], type[Message]]:
    file = descriptor_pb2.FileDescriptorProto(
        name="transformer_serving/repository_index.proto", package="inference", syntax="proto3"
    )
    request = file.message_type.add(name="RepositoryIndexRequest")
    request.field.add(name="repository_name", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    request.field.add(name="ready", number=2, type=_F.TYPE_BOOL, label=_F.LABEL_OPTIONAL)
    response = file.message_type.add(name="RepositoryIndexResponse")
    index = response.nested_type.add(name="ModelIndex")
    for number, name in enumerate(("name", "version", "state", "reason"), 1):
        index.field.add(name=name, number=number, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    response.field.add(
        name="models",
        number=1,
        type=_F.TYPE_MESSAGE,
        label=_F.LABEL_REPEATED,
        type_name=".inference.RepositoryIndexResponse.ModelIndex",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.RepositoryIndexRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.RepositoryIndexResponse")),
    )


RepositoryIndexRequest, RepositoryIndexResponse = _message_classes()


class RepositoryIndex:
    def __init__(self, plane: DataPlane):
        self.plane = plane

    @grpc_errors(SERVICE)
    async def RepositoryIndex(self, request, context: grpc.aio.ServicerContext):
        """Every served model (all are ready while the server serves; `ready` filters nothing more)."""
        return RepositoryIndexResponse(models=self.plane.repository_index())


def register(server: grpc.aio.Server, plane: DataPlane) -> None:
    handler = grpc.unary_unary_rpc_method_handler(
        RepositoryIndex(plane).RepositoryIndex,
        request_deserializer=RepositoryIndexRequest.FromString,
        response_serializer=RepositoryIndexResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(FULL_NAME, {"RepositoryIndex": handler}),))
