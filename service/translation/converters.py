"""TranslateRequest / TranslateResponse <-> the translation core's plain values (service/translation/core.py)."""

from __future__ import annotations

from service.converters import stage_timings, usage
from service.proto import inference_pb2 as pb
from service.translation.core import TranslateQuery, Translations
from service.translation.model import TranslateOptions


def translate_options(request: pb.TranslateRequest) -> TranslateOptions:
    return TranslateOptions(
        beam_size=int(request.beam_size),
        max_length=int(request.max_length),
        length_penalty=float(request.length_penalty),
    )


def translate_query(request: pb.TranslateRequest) -> TranslateQuery:
    return TranslateQuery(list(request.inputs), translate_options(request), request.model)


def translate_response(answer: Translations) -> pb.TranslateResponse:
    return pb.TranslateResponse(
        translations=[pb.Translation(text=t.text, score=t.score) for t in answer.translations],
        model=answer.model,
        usage=usage(answer.input_tokens, answer.output_tokens),
        timings=stage_timings(answer.timings),
    )
