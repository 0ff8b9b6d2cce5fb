"""TranslationService over gRPC: protobuf -> the translation core (service/translation/core.py) -> protobuf.
The HTTP door's /v1/translate and the KServe door use these converters too."""

from __future__ import annotations

import grpc

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.grpc.converters import timings, usage
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.translation.core import TranslateQuery, TranslationCore, Translations
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
        timings=timings(answer.timings),
    )


class TranslationServicer(pb_grpc.TranslationServiceServicer):
    def __init__(self, core: TranslationCore):
        self.core = core

    @grpc_errors("TranslationService")
    async def Translate(self, request: pb.TranslateRequest, context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        answer = await self.core.translate(translate_query(request), deadline_of(context))
        return translate_response(answer)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_TranslationServiceServicer_to_server(TranslationServicer(cores.translation), server)
