"""The Open Inference Protocol (KServe v2) over HTTP/REST, on the HTTP port beside the OpenAI routes.

    GET  /v2/health/live                          ServerLive       200 {"live": true}
    GET  /v2/health/ready                         ServerReady      200 {"ready": true}; 503 while draining
    GET  /v2                                      ServerMetadata   {"name", "version", "extensions"}
    GET  /v2/models/{m}[/versions/{v}]            ModelMetadata    the tensors (dataplane.py)
    GET  /v2/models/{m}[/versions/{v}]/ready      ModelReady       200 {"name", "ready": true}; 503; 404 unknown
    POST /v2/repository/index                     RepositoryIndex  [{"name", "version", "state"}] (Triton's)
    POST /v2/models/{m}[/versions/{v}]/infer      ModelInfer       JSON or binary tensors (tensors.py)

The routes convert the wire format to the data plane's calls (dataplane.py, the same calls the
gRPC binding makes), counted as service GRPCInferenceService with protocol "http" and the same
deadline header, body limits, drain and bearer tokens as every HTTP route. Failures answer the
protocol's `{"error": "..."}` with the HTTP status the other routes give the same gRPC code (400
bad input, 404 unknown model, 429 overloaded, 503 draining). A gzip (one or more members) or deflate
request body (tritonclient's request_compression_algorithm) is inflated within the same size limit;
bytes after it are refused.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.cores import Cores
from service.errors import InvalidArgument, bounded, quote
from service.http.body import read_body
from service.http.errors import STATUS, Endpoint, HttpCall, route
from service.kserve import tensors
from service.kserve.dataplane import SERVER_NAME, VERSION, DataPlane, input_texts, server_version

SERVICE = "GRPCInferenceService"  # counted as the gRPC binding's service, protocol "http"
EXTENSIONS = ["binary_tensor_data"]  # Triton's name for the binary tensor extension
INFLATE = {"gzip": 31, "deflate": 15}  # Content-Encoding -> zlib wbits (HTTP's "deflate" is zlib-wrapped)


def error(code: grpc.StatusCode, message: str) -> JSONResponse:
    """The protocol's error body, with the HTTP status every other route gives `code`."""
    return JSONResponse({"error": bounded(message)}, status_code=STATUS.get(code, (500, ""))[0])


def oip_route(method: str) -> Callable[[Endpoint], Callable[[Any, Request], Awaitable[Response]]]:
    """Counted as GRPCInferenceService/method over HTTP, every failure answered {"error": ...}."""
    return route(SERVICE, method, error)


class Routes:
    def __init__(self, cores: Cores):
        self.plane, self.settings = DataPlane(cores), cores.settings

    @oip_route("ServerLive")
    async def live(self, request: Request, call: HttpCall) -> Response:
        return JSONResponse({"live": True})

    @oip_route("ServerReady")
    async def ready(self, request: Request, call: HttpCall) -> Response:
        ready = self.plane.ready()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @oip_route("ServerMetadata")
    async def server_metadata(self, request: Request, call: HttpCall) -> Response:
        return JSONResponse({"name": SERVER_NAME, "version": server_version(), "extensions": EXTENSIONS})

    @oip_route("ModelMetadata")
    async def model_metadata(self, request: Request, call: HttpCall) -> Response:
        meta = self.plane.model_metadata(*_model(request))
        return JSONResponse(
            {
                "name": meta.name,
                "versions": meta.versions,
                "platform": meta.platform,
                "inputs": [vars(t) for t in meta.inputs],
                "outputs": [vars(t) for t in meta.outputs],
            }
        )

    @oip_route("ModelReady")
    async def model_ready(self, request: Request, call: HttpCall) -> Response:
        model = self.plane.model(*_model(request))  # unknown: 404
        ready = self.plane.ready()
        return JSONResponse({"name": model.name, "ready": ready}, status_code=200 if ready else 503)

    @oip_route("RepositoryIndex")
    async def repository_index(self, request: Request, call: HttpCall) -> Response:
        return JSONResponse(self.plane.repository_index())

    @oip_route("ModelInfer")
    async def infer(self, request: Request, call: HttpCall) -> Response:
        model = self.plane.admit(*_model(request))  # 503 / 404 before the body is read
        body = await self._body(request)
        expect, most = self.plane.expect_texts(model), self.settings.max_message_bytes
        decoded = tensors.decode_request(body, request.headers.get(tensors.HEADER_LENGTH), most, expect)
        texts = input_texts(decoded.inputs)
        done = await call.unless_gone(
            request, self.plane.infer(model, texts, list(decoded.outputs), decoded.parameters, call.deadline)
        )
        counts = {"input_tokens": done.input_tokens, "output_tokens": done.output_tokens}
        payload, header_length = tensors.encode_response(done.model, VERSION, decoded, done.outputs, counts)
        if header_length is None:
            return Response(payload, media_type="application/json")
        return Response(
            payload,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(header_length)},
        )

    async def _body(self, request: Request) -> bytes:
        """The body, inflated when it came compressed; either way at most max_message_bytes."""
        limit = self.settings.max_message_bytes
        body = await read_body(request, limit, self.settings.http_body_timeout_s)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding == "identity":
            return body
        if encoding not in INFLATE:
            raise InvalidArgument(f"Content-Encoding {quote(encoding)} is not supported; send gzip, deflate or none")
        return inflate(body, encoding, limit)


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A gzip body of one or more members (RFC 1952: their data concatenated), or one deflate stream,
    inflated to at most `limit` bytes; anything after the last member is refused, not ignored."""
    parts, size, rest, member = [], 0, body, 0
    while True:
        inflater = zlib.decompressobj(INFLATE[encoding])
        try:
            parts.append(inflater.decompress(rest, limit + 1 - size))
        except zlib.error as e:
            where = f"the {len(rest)} bytes after its member {member}" if member else "the body"
            raise InvalidArgument(f"{where} is not valid {encoding} data ({e})") from e
        size += len(parts[-1])
        if size > limit:
            raise InvalidArgument(
                f"request body inflates to over {limit} bytes (--max-message-bytes); send less per call"
            )
        if not inflater.eof:
            raise InvalidArgument(f"the {encoding} body is cut short")
        rest, member = inflater.unused_data, member + 1
        if not rest:
            return b"".join(parts)
        if encoding != "gzip":  # one zlib stream per body; gzip may hold several members
            raise InvalidArgument(f"{len(rest)} bytes follow the {encoding} stream; send the stream alone")


def _model(request: Request) -> tuple[str, str]:
    return request.path_params["model"], request.path_params.get("version", "")


def routes(cores: Cores) -> list[Route]:
    """The protocol's routes over the cores, which the server adds to the HTTP app (service/http/app.py)."""
    r = Routes(cores)
    model, version = "/v2/models/{model}", "/v2/models/{model}/versions/{version}"
    return [
        Route("/v2/health/live", r.live, methods=["GET"]),
        Route("/v2/health/ready", r.ready, methods=["GET"]),
        Route("/v2", r.server_metadata, methods=["GET"]),
        Route("/v2/repository/index", r.repository_index, methods=["POST"]),
        *(Route(path, r.model_metadata, methods=["GET"]) for path in (model, version)),
        *(Route(f"{path}/ready", r.model_ready, methods=["GET"]) for path in (model, version)),
        *(Route(f"{path}/infer", r.infer, methods=["POST"]) for path in (model, version)),
    ]
