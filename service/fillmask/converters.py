"""FillMaskRequest / FillMaskResponse <-> the fill-mask core's plain values (service/fillmask/core.py)."""

from __future__ import annotations

from service.converters import timings, usage
from service.errors import InvalidArgument
from service.fillmask.core import FilledMasks, FillMaskQuery
from service.proto import inference_pb2 as pb


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
        timings=timings(answer.total_s, answer.tokenize_s, answer.queue_s, answer.inference_s),
    )
    size = response.ByteSize()
    if size > max_bytes:
        raise InvalidArgument(
            f"the response would be {size} bytes, over the server's limit of {max_bytes} "
            "(max_message_bytes): lower top_k or split the call"
        )
    return response
