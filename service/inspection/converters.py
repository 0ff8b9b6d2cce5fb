"""AttentionRequest / AttentionResponse <-> the attention core's plain values (service/inspection/core.py)."""

from __future__ import annotations

from service.converters import timings, usage
from service.inspection.attention import AttentionQuery
from service.inspection.core import AttentionMaps
from service.inspection.stats import FIELDS
from service.proto import inference_pb2 as pb

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
    result, model, kind, total_s = answer.result, answer.model, answer.kind, answer.total_s
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
        timings=timings(total_s, result.tokenize_s, inference_s=result.inference_s),
    )
