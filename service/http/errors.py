"""HTTP errors in OpenAI's shape, mapped from the service's one exception family in one place.

Every failure below the routes is a `service.errors.ServiceError` carrying a gRPC status code; here
that code becomes an HTTP status and the body OpenAI's SDK reads:

    {"error": {"message": "unknown model 'x'; available ...", "type": "not_found_error", "code": "NOT_FOUND"}}

`code` is the gRPC status name, the same one `ts_requests_total{code=...}` counts. Anything that is
not a ServiceError is a bug: logged with its traceback, answered 500 with a generic message.

`HttpCall` is the bookkeeping of one HTTP call: the request metrics (`protocol="http"`, counted as
the RPC the route mirrors), its deadline (header `X-Request-Timeout`, seconds) and the in-flight
count the drain waits on. `route(service, method)` wraps each endpoint with it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from service.errors import Cancelled, InvalidArgument, ServiceError, bounded, start_call
from service.inflight import Inflight

log = logging.getLogger(__name__)
T = TypeVar("T")

TIMEOUT_HEADER = "x-request-timeout"  # seconds the client gives the call; absent: no deadline
INTERNAL_MESSAGE = "internal error (logged on the server)"

_S = grpc.StatusCode
STATUS = {  # gRPC code -> (HTTP status, OpenAI error type)
    _S.INVALID_ARGUMENT: (400, "invalid_request_error"),
    _S.FAILED_PRECONDITION: (400, "invalid_request_error"),
    _S.OUT_OF_RANGE: (400, "invalid_request_error"),
    _S.UNAUTHENTICATED: (401, "authentication_error"),
    _S.PERMISSION_DENIED: (403, "permission_error"),
    _S.NOT_FOUND: (404, "not_found_error"),
    _S.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    _S.CANCELLED: (499, "cancelled"),
    _S.UNIMPLEMENTED: (501, "not_implemented_error"),
    _S.UNAVAILABLE: (503, "service_unavailable_error"),
    _S.DEADLINE_EXCEEDED: (504, "timeout_error"),
}
CODE_OF_STATUS = {405: _S.UNIMPLEMENTED, 404: _S.NOT_FOUND}  # Starlette's own (unknown path, wrong method)


class SlowBody(ServiceError):
    """The client did not send a request's body in time (service/http/body.py): 408 with the
    connection closed, counted DEADLINE_EXCEEDED (504 is for the server's own deadline)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


def error_body(code: grpc.StatusCode, message: str) -> dict:
    _status, kind = STATUS.get(code, (500, "server_error"))
    return {"error": {"message": bounded(message), "type": kind, "code": code.name}}


def error_response(code: grpc.StatusCode, message: str) -> JSONResponse:
    """The one way an HTTP error leaves the server (routes, unknown paths and an auth check alike)."""
    return JSONResponse(error_body(code, message), status_code=STATUS.get(code, (500, ""))[0])


ErrorResponse = Callable[[grpc.StatusCode, str], Response]  # a protocol's error body with its HTTP status


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """exc as (gRPC code, client message); an unexpected exception is logged and hidden."""
    if isinstance(exc, ServiceError):
        return exc.code, exc.message
    if isinstance(exc, TimeoutError):  # the call's X-Request-Timeout ran out (asyncio.timeout)
        return _S.DEADLINE_EXCEEDED, "the call's deadline (X-Request-Timeout) passed before it finished"
    log.error("HTTP call failed", exc_info=exc)
    return _S.INTERNAL, INTERNAL_MESSAGE


class HttpCall:
    """One HTTP call: metrics, deadline, in-flight count; a streamed response finishes it at its end."""

    def __init__(self, request: Request, service: str, method: str):
        self.timeout = _timeout(request.headers.get(TIMEOUT_HEADER))  # first: a refusal here holds nothing
        self.record = start_call(service, method, "http")  # here: label_model works in this task
        self.inflight: Inflight = request.app.state.inflight
        self.inflight.enter()
        if request.app.state.worker_calls is not None:
            request.app.state.worker_calls.inc()
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self.streaming = False
        self._finished = False

    @property
    def method(self) -> str:
        return self.record.method

    @method.setter
    def method(self, name: str) -> None:
        self.record.method = name

    async def unless_gone(self, request: Request, work: Awaitable[T]) -> T:
        """work, cancelled when the client disconnects first (as gRPC cancels a call whose client
        left: its queued items are dropped before compute). Call it once the body is read: from
        then on uvicorn's `receive()` returns only `http.disconnect`."""
        task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                raise Cancelled("the client closed the connection")
            return task.result()
        finally:
            task.cancel()
            gone.cancel()

    def fail(self, exc: BaseException, error: ErrorResponse = error_response) -> Response:
        self.record.code, message = status_of(exc)
        response = error(self.record.code, message)
        if isinstance(exc, SlowBody):  # the rest of the body may still come: the connection cannot go on
            response.status_code = 408
            response.headers["connection"] = "close"
        return response

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.record.finish()
            self.inflight.leave()

    def stream(self, events: AsyncIterator[dict], on_close: Callable[[], None]) -> StreamingResponse:
        """Server-sent events: one `data: {json}` per event, then `data: [DONE]`; a failure after the
        200 went out becomes a last `data: {"error": ...}` event (what OpenAI's SDK raises from).
        on_close runs when the response ends, however it ends (a client gone, a stream never started)."""
        self.streaming = True
        return _EventStream(self, self._sse(events), on_close)

    async def _sse(self, events: AsyncIterator[dict]) -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):  # the client went away
            self.record.code = _S.CANCELLED
            raise
        except Exception as exc:
            self.record.code, message = status_of(exc)
            yield f"data: {json.dumps(error_body(self.record.code, message))}\n\n"
        finally:
            self.finish()


class _EventStream(StreamingResponse):
    """Finishes its call when the response ends: an async generator that never started (the client
    left before the first event) has no `finally` to run, so the response's own call does it."""

    def __init__(self, call: HttpCall, body: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(body, media_type="text/event-stream", headers={"cache-control": "no-cache"})
        self._call, self._on_close = call, on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException:
            if self._call.record.code == _S.OK:
                self._call.record.code = _S.CANCELLED
            raise
        finally:
            self._on_close()
            self._call.finish()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _timeout(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise InvalidArgument(f"header X-Request-Timeout={raw[:32]!r} must be a number of seconds > 0")
    return seconds


Endpoint = Callable[[Any, Request, HttpCall], Awaitable[Response]]


def route(
    service: str, method: str, error: ErrorResponse = error_response
) -> Callable[[Endpoint], Callable[[Any, Request], Awaitable[Response]]]:
    """Wraps an endpoint method `fn(self, request, call)`: counts it as service/method over HTTP,
    applies its deadline, and turns every failure into `error(code, message)` (OpenAI's shape unless
    told otherwise; never a traceback)."""

    def wrap(fn: Endpoint) -> Callable[[Any, Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def endpoint(self, request: Request) -> Response:
            try:
                call = HttpCall(request, service, method)
            except ServiceError as exc:  # a bad X-Request-Timeout: refused before it is counted
                return error(exc.code, exc.message)
            try:
                async with asyncio.timeout(call.timeout):
                    return await fn(self, request, call)
            except asyncio.CancelledError:
                call.record.code = _S.CANCELLED
                raise
            except Exception as exc:
                return call.fail(exc, error)
            finally:
                if not call.streaming:
                    call.finish()

        return endpoint

    return wrap
