"""The HTTP routes (Starlette): OpenAI-compatible embeddings, completions and models, translate, health.

Each route is a few lines, as the gRPC methods are: JSON -> the protobuf request (schemas.py), the
gRPC servicer's own core for the work (same registry, models, batchers and schedulers, same
validation and admission), the reply -> JSON. `route()` (errors.py) counts the call as the RPC it
mirrors with protocol="http" and maps every failure to OpenAI's error shape.

    POST /v1/embeddings    EmbeddingService/Embed
    POST /v1/completions   GenerationService/Generate (GenerateStream with "stream": true)
    GET  /v1/models        ModelService/ListModels      GET /v1/models/{id}  ModelService/GetModel
    POST /v1/translate     TranslationService/Translate (JSON of TranslateRequest/TranslateResponse)
    POST /v1/fill-mask     FillMaskService/FillMask     (JSON of FillMaskRequest/FillMaskResponse)
    GET  /health           200 while the service is SERVING, else 503 (warming up, draining); not counted

Authentication (and anything else every route must pass) goes in `build_app(middleware=...)`: one
Starlette middleware in front of every route, answering with `errors.error_response`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import grpc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service import converters
from service.embedding.grpc import EmbeddingServicer
from service.errors import label_model
from service.fillmask.grpc import FillMaskServicer
from service.generation import converters as generation_converters
from service.generation.grpc import GenerationServicer
from service.http import schemas
from service.http.body import read_json
from service.http.errors import CODE_OF_STATUS, HttpCall, error_body, route
from service.inflight import Inflight
from service.registry import ModelRegistry
from service.settings import Settings
from service.translation.grpc import TranslationServicer


class Routes:
    """The endpoints, over the servicers the gRPC server also builds on the same registry."""

    def __init__(self, registry: ModelRegistry, settings: Settings, is_serving: Callable[[], bool]):
        self.registry, self.settings, self.is_serving = registry, settings, is_serving
        self.embedding = EmbeddingServicer(registry, settings)
        self.generation = GenerationServicer(registry)
        self.translation = TranslationServicer(registry)
        self.fill_masks = FillMaskServicer(registry, settings)

    async def _json(self, request: Request) -> dict:
        """The body as a JSON object, bounded in size, time and nesting (service/http/body.py)."""
        return await read_json(request, self.settings.max_message_bytes, self.settings.http_body_timeout_s)

    @route("EmbeddingService", "Embed")
    async def embeddings(self, request: Request, call: HttpCall) -> Response:
        pb_request = schemas.embed_request(await self._json(request))
        reply = await call.unless_gone(request, self.embedding.embed(pb_request, call.deadline))
        packed = pb_request.encoding == schemas.ENCODING_FORMATS["base64"]
        return JSONResponse(schemas.embed_response(reply, packed))

    @route("GenerationService", "Generate")
    async def completions(self, request: Request, call: HttpCall) -> Response:
        pb_request, stream = schemas.generate_request(await self._json(request))
        if stream:
            call.method = "GenerateStream"
        model, handle = await self.generation.submit(pb_request)  # refusals come here, before any 200
        completion = schemas.Completion(model.name)
        if stream:
            return call.stream(self._chunks(handle, completion, call.deadline), on_close=handle.cancel)
        try:
            chunks = await call.unless_gone(request, _collect(handle))
        finally:
            handle.cancel()
        return JSONResponse(completion.response(generation_converters.generate_response(chunks, model.name)))

    @staticmethod
    async def _chunks(handle, completion: schemas.Completion, deadline: float | None):
        loop = asyncio.get_running_loop()
        when = None if deadline is None else loop.time() + (deadline - time.monotonic())  # same clock
        while True:  # the response cancels the handle when it ends: a client gone frees its cache row
            async with asyncio.timeout_at(when):  # TimeoutError: a last error event, code DEADLINE_EXCEEDED
                chunk = await anext(handle, None)
            if chunk is None:
                return
            # Chunks that queued up while the previous event was written go out as one.
            yield completion.chunk(generation_converters.join_chunks([chunk, *handle.ready()]))

    @route("ModelService", "ListModels")
    async def list_models(self, request: Request, call: HttpCall) -> Response:
        self.registry.admit()
        infos = [self._info(b) for b in self.registry]
        return JSONResponse({"object": "list", "data": [schemas.model_json(i) for i in infos]})

    @route("ModelService", "GetModel")
    async def get_model(self, request: Request, call: HttpCall) -> Response:
        self.registry.admit()
        backend = self.registry.find(request.path_params["name"])
        label_model(backend.name)
        return JSONResponse(schemas.model_json(self._info(backend)))

    def _info(self, backend):
        return converters.model_info(backend.info(), self.registry.is_default(backend))

    @route("TranslationService", "Translate")
    async def translate(self, request: Request, call: HttpCall) -> Response:
        pb_request = schemas.translate_request(await self._json(request))
        reply = await call.unless_gone(request, self.translation.translate(pb_request))
        return JSONResponse(schemas.message_json(reply))

    @route("FillMaskService", "FillMask")
    async def fill_mask(self, request: Request, call: HttpCall) -> Response:
        pb_request = schemas.fill_mask_request(await self._json(request))
        reply = await call.unless_gone(request, self.fill_masks.fill_mask(pb_request, call.deadline))
        return JSONResponse(schemas.message_json(reply))

    async def health(self, request: Request) -> Response:
        serving = self.is_serving() and not self.registry.draining
        return JSONResponse({"status": "SERVING" if serving else "NOT_SERVING"}, status_code=200 if serving else 503)


async def _collect(handle) -> list:
    return await handle.collect()  # one wake-up at the end, not one per decode step


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (unknown path, wrong method) in the same shape as every other."""
    code = CODE_OF_STATUS.get(exc.status_code, grpc.StatusCode.INVALID_ARGUMENT)
    return JSONResponse(error_body(code, f"{request.method} {request.url.path}: {exc.detail}"),
                        status_code=exc.status_code)


def build_app(registry: ModelRegistry, settings: Settings, is_serving: Callable[[], bool],
              middleware: Sequence[Middleware] = (), worker_calls=None) -> Starlette:
    """The ASGI app; `app.state.inflight` counts the calls the drain waits for; worker_calls (a
    worker's `ts_worker_rpcs_total` child) counts every routed call, as gRPC's interceptor does."""
    r = Routes(registry, settings, is_serving)
    app = Starlette(routes=[
        Route("/v1/embeddings", r.embeddings, methods=["POST"]),
        Route("/v1/completions", r.completions, methods=["POST"]),
        Route("/v1/models", r.list_models, methods=["GET"]),
        Route("/v1/models/{name:path}", r.get_model, methods=["GET"]),
        Route("/v1/translate", r.translate, methods=["POST"]),
        Route("/v1/fill-mask", r.fill_mask, methods=["POST"]),
        Route("/health", r.health, methods=["GET"]),
    ], middleware=list(middleware), exception_handlers={HTTPException: _http_error})
    app.state.inflight = Inflight()
    app.state.worker_calls = worker_calls
    return app
