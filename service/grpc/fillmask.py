"""FillMaskService over gRPC: protobuf -> the fill-mask core (service/fillmask/core.py) -> protobuf.
The HTTP door's /v1/fill-mask and the KServe door use these converters too."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import InvalidArgument, deadline_of, grpc_errors
from service.fillmask.core import FilledMasks, FillMaskCore, FillMaskQuery
from service.grpc.converters import timings, usage
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

SERVICE = "FillMaskService"


def fill_mask_query(request: pb.FillMaskRequest) -> FillMaskQuery:
    return FillMaskQuery(inputs=list(request.inputs), model=request.model, top_k=int(request.top_k))


def fill_mask_response(answer: FilledMasks, max_bytes: int) -> pb.FillMaskResponse:
    """The reply; over `max_bytes` (settings max_message_bytes) it is refused with INVALID_ARGUMENT rather
    than left to fail in transport."""
    response = pb.FillMaskResponse(
        results=[
            pb.FilledInput(
                masks=[
                    pb.MaskPrediction(
                        candidates=[
                            pb.MaskCandidate(token=c.token, token_id=c.token_id, score=c.score, sequence=c.sequence)
                            for c in mask
                        ]
                    )
                    for mask in masks
                ]
            )
            for masks in answer.results
        ],
        model=answer.model,
        usage=usage(answer.input_tokens),
        timings=timings(answer.timings),
    )
    size = response.ByteSize()
    if size > max_bytes:
        raise InvalidArgument(
            f"the response would be {size} bytes, over the server's limit of {max_bytes} "
            "(max_message_bytes): lower top_k or split the call"
        )
    return response


class FillMaskServicer(pb_grpc.FillMaskServiceServicer):
    def __init__(self, core: FillMaskCore, max_bytes: int):
        self.core, self.max_bytes = core, max_bytes

    @grpc_errors(SERVICE)
    async def FillMask(self, request: pb.FillMaskRequest, context: grpc.aio.ServicerContext) -> pb.FillMaskResponse:
        answer = await self.core.fill_mask(fill_mask_query(request), deadline_of(context))
        return fill_mask_response(answer, self.max_bytes)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    servicer = FillMaskServicer(cores.fill_mask, cores.settings.max_message_bytes)
    pb_grpc.add_FillMaskServiceServicer_to_server(servicer, server)
