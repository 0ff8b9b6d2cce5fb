"""ClassificationService over gRPC (Rerank, Classify): protobuf -> the classification core
(service/classification/core.py) -> protobuf. The converters here are the only place that knows
both the messages and the core's plain values."""

from __future__ import annotations

import grpc

from service.classification.core import ClassificationCore, Classified, ClassifyQuery, RerankQuery, Scored
from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.grpc.converters import timings, usage
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

SERVICE = "ClassificationService"


def rerank_query(request: pb.RerankRequest) -> RerankQuery:
    return RerankQuery(
        query=request.query,
        documents=list(request.documents),
        model=request.model,
        top_n=request.top_n if request.HasField("top_n") else None,
        raw_scores=request.raw_scores,
        truncate=request.truncate if request.HasField("truncate") else True,
    )


def rerank_response(answer: Scored, request: pb.RerankRequest) -> pb.RerankResponse:
    docs = request.documents if request.return_documents else None
    results = [
        pb.RerankResult(index=i, score=s, document=docs[i] if docs is not None else "")
        for i, s in zip(answer.indexes, answer.scores, strict=True)
    ]
    return pb.RerankResponse(
        results=results,
        model=answer.model,
        usage=usage(answer.input_tokens),
        timings=timings(answer.timings),
        request_id=request.request_id,
    )


def classify_query(request: pb.ClassifyRequest) -> ClassifyQuery:
    return ClassifyQuery(
        inputs=[(x.text, x.text_pair if x.HasField("text_pair") else None) for x in request.inputs],
        model=request.model,
        raw_scores=request.raw_scores,
        truncate=request.truncate if request.HasField("truncate") else True,
    )


def ranked_labels(answer: Classified, row: int) -> list[tuple[int, str, float]]:
    """One input's (label id, label, score), best first (every door's order)."""
    scores = answer.scores[row].tolist()
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return [(i, answer.labels[i], scores[i]) for i in order]


def classify_response(answer: Classified, request_id: str) -> pb.ClassifyResponse:
    results = [
        pb.Classification(
            labels=[pb.LabelScore(label=lab, score=s, label_id=i) for i, lab, s in ranked_labels(answer, r)]
        )
        for r in range(len(answer.scores))
    ]
    return pb.ClassifyResponse(
        results=results,
        model=answer.model,
        usage=usage(answer.input_tokens),
        timings=timings(answer.timings),
        request_id=request_id,
    )


class ClassificationServicer(pb_grpc.ClassificationServiceServicer):
    def __init__(self, core: ClassificationCore):
        self.core = core

    @grpc_errors(SERVICE)
    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        return rerank_response(await self.core.rerank(rerank_query(request), deadline_of(context)), request)

    @grpc_errors(SERVICE)
    async def Classify(self, request: pb.ClassifyRequest, context: grpc.aio.ServicerContext) -> pb.ClassifyResponse:
        answer = await self.core.classify(classify_query(request), deadline_of(context))
        return classify_response(answer, request.request_id)


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_ClassificationServiceServicer_to_server(ClassificationServicer(cores.classification), server)
