"""SparseEmbeddingService over gRPC: protobuf -> the sparse-embedding core (service/sparse/core.py) ->
protobuf; `sparse_query` is also the KServe door's converter."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.grpc.converters import timings, usage
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.sparse.core import SparseEmbeddingCore, SparseEmbeddings, SparseQuery


def sparse_query(request: pb.EmbedSparseRequest) -> SparseQuery:
    """An EmbedSparseRequest as plain values, optional fields resolved to their defaults."""
    return SparseQuery(
        inputs=list(request.inputs),
        model=request.model,
        truncate=request.truncate if request.HasField("truncate") else True,
        prompt_name=request.prompt_name,
        prompt=request.prompt if request.HasField("prompt") else None,
    )


def sparse_response(answer: SparseEmbeddings, request_id: str) -> pb.EmbedSparseResponse:
    vectors = [pb.SparseEmbedding(indices=v.indices.tolist(), values=v.values.tolist()) for v in answer.vectors]
    return pb.EmbedSparseResponse(
        embeddings=vectors,
        model=answer.model,
        usage=usage(answer.input_tokens),
        timings=timings(answer.timings),
        request_id=request_id,
    )


class SparseEmbeddingServicer(pb_grpc.SparseEmbeddingServiceServicer):
    def __init__(self, core: SparseEmbeddingCore):
        self.core = core

    @grpc_errors("SparseEmbeddingService")
    async def EmbedSparse(
        self, request: pb.EmbedSparseRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedSparseResponse:
        answer = await self.core.embed_sparse(sparse_query(request), deadline_of(context))
        return sparse_response(answer, request.request_id)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_SparseEmbeddingServiceServicer_to_server(SparseEmbeddingServicer(cores.sparse), server)
