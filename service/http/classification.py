"""The HTTP routes of the classification kind (rerank, score, classify), each JSON -> the core's query ->
JSON (shapes: rerank_schemas.py), counted as the gRPC method they mirror:

    POST /rerank                 ClassificationService/Rerank    (TEI)
    POST /v1/rerank, /v2/rerank  ClassificationService/Rerank    (Cohere, Jina)
    POST /v1/score               ClassificationService/Score     (vLLM)
    POST /predict                ClassificationService/Classify  (TEI)
    POST /classify               ClassificationService/Classify  (infinity)

A call without `model` goes to the default classification model.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.cores import Cores
from service.http import rerank_schemas as rs
from service.http.body import read_json
from service.http.errors import HttpCall, route

SERVICE = "ClassificationService"


class Routes:
    def __init__(self, cores: Cores):
        self.core, self.settings = cores.classification, cores.settings
        # array lengths checked before any element is decoded
        self.documents = (self.settings.rerank_max_documents, "rerank_max_documents")
        self.inputs = (self.settings.classify_max_inputs, "classify_max_inputs")

    async def _json(self, request: Request) -> dict:
        return await read_json(request, self.settings.max_message_bytes, self.settings.http_body_timeout_s)

    @route(SERVICE, "Rerank")
    async def tei_rerank(self, request: Request, call: HttpCall) -> Response:
        query, return_text = rs.tei_rerank(await self._json(request), self.documents)
        answer = await call.unless_gone(request, self.core.rerank(query, call.deadline))
        return JSONResponse(rs.tei_ranked(answer, query, return_text))

    async def _cohere(self, request: Request, call: HttpCall, version: int) -> Response:
        query, return_documents = rs.cohere_rerank(await self._json(request), version, self.documents)
        answer = await call.unless_gone(request, self.core.rerank(query, call.deadline))
        return JSONResponse(rs.cohere_ranked(answer, query, return_documents))

    @route(SERVICE, "Rerank")
    async def rerank_v1(self, request: Request, call: HttpCall) -> Response:
        return await self._cohere(request, call, 1)

    @route(SERVICE, "Rerank")
    async def rerank_v2(self, request: Request, call: HttpCall) -> Response:
        return await self._cohere(request, call, 2)

    @route(SERVICE, "Score")
    async def score(self, request: Request, call: HttpCall) -> Response:
        query = rs.vllm_score(await self._json(request), self.documents)
        answer = await call.unless_gone(request, self.core.score(query, call.deadline))
        return JSONResponse(rs.vllm_scores(answer))

    @route(SERVICE, "Classify")
    async def predict(self, request: Request, call: HttpCall) -> Response:
        query, batch = rs.tei_predict(await self._json(request), self.inputs)
        answer = await call.unless_gone(request, self.core.classify(query, call.deadline))
        rows = rs.labelled(answer)
        return JSONResponse(rows if batch else rows[0])

    @route(SERVICE, "Classify")
    async def classify(self, request: Request, call: HttpCall) -> Response:
        query = rs.classify_request(await self._json(request), self.inputs)
        answer = await call.unless_gone(request, self.core.classify(query, call.deadline))
        return JSONResponse(rs.classify_response(answer))


def routes(cores: Cores) -> list[Route]:
    """The kind's routes over the cores, for the HTTP app (service/http/app.py)."""
    r = Routes(cores)
    return [
        Route("/rerank", r.tei_rerank, methods=["POST"]),
        Route("/v1/rerank", r.rerank_v1, methods=["POST"]),
        Route("/v2/rerank", r.rerank_v2, methods=["POST"]),
        Route("/v1/score", r.score, methods=["POST"]),
        Route("/predict", r.predict, methods=["POST"]),
        Route("/classify", r.classify, methods=["POST"]),
    ]
