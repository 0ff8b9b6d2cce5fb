"""Protobuf <-> plain values for TranslationService (engines never see protobuf)."""

from __future__ import annotations

from service.converters import usage
from service.generation.converters import timings
from service.proto import inference_pb2 as pb
from service.translation.model import TranslateOptions, TranslateResult


def translate_options(request: pb.TranslateRequest) -> TranslateOptions:
    return TranslateOptions(
        beam_size=int(request.beam_size) or 1,
        max_length=int(request.max_length),
        length_penalty=float(request.length_penalty) if request.length_penalty != 0 else 1.0,
    )


def translate_response(result: TranslateResult, model: str) -> pb.TranslateResponse:
    return pb.TranslateResponse(
        translations=[pb.Translation(text=t.text, score=t.score) for t in result.translations],
        model=model,
        usage=usage(result.input_tokens, result.output_tokens),
        timings=timings(result.timings),
    )
