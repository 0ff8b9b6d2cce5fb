"""The HTTP routes (Starlette), each a few lines: JSON -> the core's query -> JSON, over the same
cores the gRPC servicers call (service/cores.py). `route()` (errors.py) counts the call as the RPC
it mirrors (protocol="http"), gives the core its deadline and maps failures to OpenAI's error shape.

    POST /v1/embeddings        EmbeddingService/Embed
    POST /v1/completions       GenerationService/Generate (GenerateStream with "stream": true)
    POST /v1/chat/completions  GenerationService/Chat (ChatStream with "stream": true): service/http/chat.py
    POST /tokenize             GenerationService/Tokenize      POST /detokenize  GenerationService/Detokenize
    GET  /tokenizer_info       GenerationService/TokenizerInfo
    GET  /v1/models            ModelService/ListModels         GET /v1/models/{id}  ModelService/GetModel
    POST /v1/translate         TranslationService/Translate
    POST /v1/fill-mask         FillMaskService/FillMask
    POST /rerank, /v1/rerank, /v2/rerank, /v1/score, /predict, /classify: service/http/classification.py
    POST /embed, /embed_sparse EmbeddingService/Embed, SparseEmbeddingService/EmbedSparse: service/http/tei.py
    GET  /health               200 while SERVING, else 503 (warming up, draining); not counted
    /v2/...                    the Open Inference Protocol (KServe v2) REST binding: service/kserve/rest.py,
                               whose routes the server hands in (`build_app(extra_routes=...)`)

Authentication (anything every route must pass) goes in `build_app(middleware=...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from service.cores import Cores
from service.generation import tools
from service.generation.chat import Chat, ChatCore
from service.generation.core import Generation, join_chunks
from service.grpc.fillmask import fill_mask_query, fill_mask_response
from service.grpc.translation import translate_query, translate_response
from service.http import chat, classification, completions, schemas, tei, tokenization
from service.http.body import read_json
from service.http.errors import CODE_OF_STATUS, HttpCall, error_body, route
from service.inflight import Inflight


class Routes:
    """The endpoints, over the cores the gRPC servicers also call."""

    def __init__(self, cores: Cores, is_serving: Callable[[], bool]):
        self.cores, self.registry, self.settings, self.is_serving = cores, cores.registry, cores.settings, is_serving
        self.chats = ChatCore(cores.generation)

    async def _json(self, request: Request) -> dict:
        """The body as a JSON object, bounded in size, time and nesting (service/http/body.py)."""
        return await read_json(request, self.settings.max_message_bytes, self.settings.http_body_timeout_s)

    @route("EmbeddingService", "Embed")
    async def embeddings(self, request: Request, call: HttpCall) -> Response:
        query, packed = schemas.embed_request(await self._json(request), self.settings.embed_max_inputs)
        answer = await call.unless_gone(request, self.cores.embedding.embed(query, call.deadline))
        return JSONResponse(schemas.embed_response(answer, packed))

    @route("GenerationService", "Generate")
    async def completions(self, request: Request, call: HttpCall) -> Response:
        body = await self._json(request)
        query = completions.parse(body, self.settings.gen_max_queue)  # completions.py
        if query.stream:
            call.method = "GenerateStream"
        queries = await self.chats.constrained(query.queries, query.structure)  # structured outputs
        # Every choice of every prompt admitted at once; refusals here, before any 200.
        generations: list[Generation] = await self.cores.generation.generate_many(queries, call.deadline)
        return await completions.answer(request, call, query, generations)

    @route("GenerationService", "Chat")
    async def chat_completions(self, request: Request, call: HttpCall) -> Response:
        query = chat.parse(await self._json(request))  # service/http/chat.py
        if query.stream:
            call.method = "ChatStream"
        admitted = await self.chats.chat(query.query, call.deadline)  # refusals here, before any 200
        try:
            completion = chat.Completion(admitted.model)
            if query.stream:
                events = _chat_events(admitted, completion, query)
                return call.stream(events, on_close=admitted.cancel)
            try:
                chunks = await call.unless_gone(request, admitted.generation.collect())
            finally:
                admitted.cancel()
            return JSONResponse(completion.response(admitted, chunks, query))
        except BaseException:
            admitted.cancel()
            raise

    @route("GenerationService", "Tokenize")
    async def tokenize(self, request: Request, call: HttpCall) -> Response:
        body = await self._json(request)
        return await tokenization.tokenize(self.cores.generation, body, self.settings.max_message_bytes)

    @route("GenerationService", "Detokenize")
    async def detokenize(self, request: Request, call: HttpCall) -> Response:
        body = await self._json(request)
        return await tokenization.detokenize(self.cores.generation, body, self.settings.max_message_bytes)

    @route("GenerationService", "TokenizerInfo")
    async def tokenizer_info(self, request: Request, call: HttpCall) -> Response:
        name = schemas.text("model", request.query_params.get("model", ""))
        return JSONResponse(tokenization.tokenizer_info(self.cores.generation, name))

    @route("ModelService", "ListModels")
    async def list_models(self, request: Request, call: HttpCall) -> Response:
        infos = self.cores.models.list()
        return JSONResponse({"object": "list", "data": [schemas.model_json(i) for i in infos]})

    @route("ModelService", "GetModel")
    async def get_model(self, request: Request, call: HttpCall) -> Response:
        return JSONResponse(schemas.model_json(self.cores.models.get(request.path_params["name"])))

    @route("TranslationService", "Translate")
    async def translate(self, request: Request, call: HttpCall) -> Response:
        body = schemas.translate_request(await self._json(request), self.settings.translate_max_inputs)
        query = translate_query(body)
        answer = await call.unless_gone(request, self.cores.translation.translate(query, call.deadline))
        return JSONResponse(schemas.message_json(translate_response(answer)))

    @route("FillMaskService", "FillMask")
    async def fill_mask(self, request: Request, call: HttpCall) -> Response:
        body = schemas.fill_mask_request(await self._json(request), self.settings.embed_max_inputs)
        query = fill_mask_query(body)
        answer = await call.unless_gone(request, self.cores.fill_mask.fill_mask(query, call.deadline))
        reply = fill_mask_response(answer, self.settings.max_message_bytes)
        return JSONResponse(schemas.message_json(reply))

    async def health(self, request: Request) -> Response:
        serving = self.is_serving() and not self.registry.draining
        return JSONResponse({"status": "SERVING" if serving else "NOT_SERVING"}, status_code=200 if serving else 503)


async def _chat_events(admitted: Chat, completion: chat.Completion, query: chat.ChatRequest):
    """A streamed chat: the role first, then each batch of chunks as one delta, then the usage."""
    generation, splitter = admitted.generation, admitted.splitter()
    yield completion.first(query.include_usage)
    if query.tool_choice.mode != "none":  # tool calls are parsed
        async for event in _tool_events(admitted, completion, query):
            yield event
        return
    async for joined in generation.batches():  # chunks that queued up while one was written go out as one
        yield completion.event(joined, splitter, query.logprobs, query.include_usage)
        if joined.finish_reason is not None and query.include_usage:
            yield completion.usage_event(joined)


async def _tool_events(admitted: Chat, completion: chat.Completion, query: chat.ChatRequest):
    """A streamed chat whose tool calls are parsed: reasoning as it comes, each call as soon as it is
    complete (tools.CallStream), then the content and calls left with the finish reason, the usage."""
    generation, splitter = admitted.generation, admitted.splitter()
    calls, chunks = tools.CallStream(query.tool_choice, admitted.tool_parser), []
    async for joined in generation.batches():
        chunks.append(joined)
        thought, said = splitter.feed(chunks[-1].text)
        first = calls.sent
        content, new = calls.feed(said)
        if thought or new:
            yield completion.tool_event(thought, content, new, first, query)
    thought, said = splitter.finish()
    whole = join_chunks(chunks)
    yield completion.last_tool_event(thought, said, calls, whole, query)
    if query.include_usage:
        yield completion.usage_event(whole)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (unknown path, wrong method) in the same shape as every other."""
    assert isinstance(exc, HTTPException)  # registered for HTTPException only (exception_handlers)
    code = CODE_OF_STATUS.get(exc.status_code, grpc.StatusCode.INVALID_ARGUMENT)
    if request.url.path.startswith("/v2"):  # the KServe routes' own error shape
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse({"error": message}, status_code=exc.status_code)
    return JSONResponse(
        error_body(code, f"{request.method} {request.url.path}: {exc.detail}"), status_code=exc.status_code
    )


def build_app(
    cores: Cores,
    is_serving: Callable[[], bool],
    middleware: Sequence[Middleware] = (),
    worker_calls=None,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The ASGI app; `app.state.inflight` counts the calls the drain waits for; worker_calls (a
    worker's `ts_worker_rpcs_total` child) counts every routed call, as gRPC's interceptor does;
    extra_routes are another door's on the same port (KServe's REST binding)."""
    r = Routes(cores, is_serving)
    app = Starlette(
        routes=[
            Route("/v1/embeddings", r.embeddings, methods=["POST"]),
            Route("/v1/completions", r.completions, methods=["POST"]),
            Route("/v1/chat/completions", r.chat_completions, methods=["POST"]),
            Route("/tokenize", r.tokenize, methods=["POST"]),
            Route("/detokenize", r.detokenize, methods=["POST"]),
            Route("/tokenizer_info", r.tokenizer_info, methods=["GET"]),
            Route("/v1/models", r.list_models, methods=["GET"]),
            Route("/v1/models/{name:path}", r.get_model, methods=["GET"]),
            Route("/v1/translate", r.translate, methods=["POST"]),
            Route("/v1/fill-mask", r.fill_mask, methods=["POST"]),
            Route("/health", r.health, methods=["GET"]),
            *classification.routes(cores),
            *tei.routes(cores),
            *extra_routes,
        ],
        middleware=list(middleware),
        exception_handlers={HTTPException: _http_error},
    )
    app.state.inflight = Inflight()
    app.state.worker_calls = worker_calls
    return app
