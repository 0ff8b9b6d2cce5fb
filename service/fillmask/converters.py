"""FillMask protobuf <-> plain values (the shared Usage / Timings come from service.converters)."""

from __future__ import annotations

from service.converters import timings, usage
from service.fillmask.model import FillResult
from service.proto import inference_pb2 as pb


def fill_mask_response(result: FillResult, model: str, total_s: float) -> pb.FillMaskResponse:
    return pb.FillMaskResponse(
        results=[pb.FilledInput(masks=[pb.MaskPrediction(candidates=[
            pb.MaskCandidate(token=c.token, token_id=c.token_id, score=c.score, sequence=c.sequence)
            for c in mask]) for mask in masks]) for masks in result.results],
        model=model,
        usage=usage(result.input_tokens),
        timings=timings(total_s, result.tokenize_s, result.queue_s, result.inference_s),
    )
