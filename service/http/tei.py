"""Text Embeddings Inference's embedding routes, JSON -> the cores' queries -> JSON, counted as the gRPC
methods they mirror:

    POST /embed         EmbeddingService/Embed              {inputs, normalize, truncate, dimensions,
                                                              prompt_name} -> [[float, ...], ...]
    POST /embed_sparse  SparseEmbeddingService/EmbedSparse  {inputs, truncate, prompt_name}
                                                              -> [[{"index": i, "value": v}, ...], ...]

`inputs` is one text or an array of texts (TEI's token-id arrays are refused); a call without `model`
goes to the default model of the kind; a model of the other kind named: 400 naming its kind.
`truncate` defaults to true, as on this server's other doors (TEI's default is its `--auto-truncate`);
`truncation_direction` may only be "Right" (the end of a text is cut).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.cores import Cores
from service.embedding.core import EmbedQuery
from service.errors import InvalidArgument, quote
from service.http.body import read_json
from service.http.errors import HttpCall, route
from service.http.schemas import field, strings
from service.sparse.core import SparseQuery


def _truncate(body: dict) -> bool:
    direction = field(body, "truncation_direction", str, "Right")
    if direction.lower() != "right":
        raise InvalidArgument(f"truncation_direction={quote(direction)} is not supported (only Right)")
    return field(body, "truncate", bool, True)


def embed_request(body: dict, most: int) -> EmbedQuery:
    return EmbedQuery(
        inputs=strings(body, "inputs", most=(most, "embed_max_inputs")),
        model=field(body, "model", str, ""),
        normalize=field(body, "normalize", bool, True),
        truncate=_truncate(body),
        dimensions=field(body, "dimensions", int, 0, minimum=0),
        prompt_name=field(body, "prompt_name", str, ""),
    )


def sparse_request(body: dict, most: int) -> SparseQuery:
    return SparseQuery(
        inputs=strings(body, "inputs", most=(most, "embed_max_inputs")),
        model=field(body, "model", str, ""),
        truncate=_truncate(body),
        prompt_name=field(body, "prompt_name", str, ""),
    )


class Routes:
    def __init__(self, cores: Cores):
        self.cores, self.settings = cores, cores.settings

    async def _json(self, request: Request) -> dict:
        return await read_json(request, self.settings.max_message_bytes, self.settings.http_body_timeout_s)

    @route("EmbeddingService", "Embed")
    async def embed(self, request: Request, call: HttpCall) -> Response:
        query = embed_request(await self._json(request), self.settings.embed_max_inputs)
        answer = await call.unless_gone(request, self.cores.embedding.embed(query, call.deadline))
        return JSONResponse(answer.vectors.tolist())

    @route("SparseEmbeddingService", "EmbedSparse")
    async def embed_sparse(self, request: Request, call: HttpCall) -> Response:
        query = sparse_request(await self._json(request), self.settings.embed_max_inputs)
        answer = await call.unless_gone(request, self.cores.sparse.embed_sparse(query, call.deadline))
        rows = [
            [{"index": i, "value": v} for i, v in zip(vec.indices.tolist(), vec.values.tolist(), strict=True)]
            for vec in answer.vectors
        ]
        return JSONResponse(rows)


def routes(cores: Cores) -> list[Route]:
    """TEI's embedding routes over the cores, for the HTTP app (service/http/app.py)."""
    r = Routes(cores)
    return [Route("/embed", r.embed, methods=["POST"]), Route("/embed_sparse", r.embed_sparse, methods=["POST"])]
