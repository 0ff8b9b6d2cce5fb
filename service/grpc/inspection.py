"""InspectionService over gRPC: protobuf -> the attention core (service/inspection/core.py) -> protobuf."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.grpc.converters import timings, usage
from service.inspection.attention import AttentionQuery
from service.inspection.core import AttentionCore, AttentionMaps
from service.inspection.stats import FIELDS
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

KINDS = {"self": pb.SELF, "causal": pb.CAUSAL, "cross": pb.CROSS}


def attention_query(request: pb.AttentionRequest) -> AttentionQuery:
    return AttentionQuery(
        text=request.text,
        target=request.target,
        layers=tuple(request.layers),
        heads=tuple(request.heads),
        model=request.model,
    )


def attention_response(answer: AttentionMaps) -> pb.AttentionResponse:
    result, model, kind = answer.result, answer.model, answer.kind
    maps = [
        pb.AttentionMap(
            kind=KINDS[m.kind],
            layer=m.layer,
            head=m.head,
            rows=m.weights.shape[0],
            cols=m.weights.shape[1],
            weights=m.weights.ravel().tolist(),
            stats=pb.HeadStats(**{f: float(v) for f, v in zip(FIELDS, m.stats)}),
        )
        for m in result.maps
    ]
    return pb.AttentionResponse(
        model=model,
        kind=kind,
        source_tokens=result.source_tokens,
        target_tokens=result.target_tokens,
        target=result.target,
        maps=maps,
        usage=usage(result.input_tokens, result.output_tokens),
        timings=timings(answer.timings),
    )


class InspectionServicer(pb_grpc.InspectionServiceServicer):
    def __init__(self, core: AttentionCore):
        self.core = core

    @grpc_errors("InspectionService")
    async def Attention(self, request: pb.AttentionRequest, context: grpc.aio.ServicerContext) -> pb.AttentionResponse:
        answer = await self.core.attention(attention_query(request), deadline_of(context))
        return attention_response(answer)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_InspectionServiceServicer_to_server(InspectionServicer(cores.attention), server)
