"""Request bytes that do not parse as the method's message: INVALID_ARGUMENT, not UNKNOWN.

grpc.aio deserializes a request before any handler runs; when the message's `FromString` raises
(protobuf's DecodeError on `0a 04 61 62 ff fe`: a string field holding invalid UTF-8), grpc
answers UNKNOWN with the exception's class and text and logs a traceback. `guard(handler, method)`
gives a method's handler a deserializer that returns an `Undecodable` marker instead of raising,
and a behaviour that refuses the marker with INVALID_ARGUMENT naming the message type (counted in
`ts_requests_total` like any refusal); request streams are checked message by message. The
interceptor of every call (service/inflight.py `TrackCalls`) applies it once per method.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable

import grpc

from service.errors import start_call


class Undecodable:
    """Stands for request bytes that did not parse (what the deserializer returns instead of raising)."""

    def __init__(self, type_name: str, size: int):
        self.type_name, self.size = type_name, size

    @property
    def message(self) -> str:
        return (
            f"the request ({self.size} bytes) is not a valid {self.type_name} protobuf message; check that "
            "the client uses this server's .proto files"
        )


def guard(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """handler with undecodable requests refused (INVALID_ARGUMENT) instead of raising inside grpc."""
    if handler.request_deserializer is None:  # raw bytes: nothing to decode
        return handler
    kind = (
        ("stream" if handler.request_streaming else "unary")
        + "_"
        + ("stream" if handler.response_streaming else "unary")
    )
    behaviour = getattr(handler, kind)
    if handler.request_streaming:
        checked = _streaming_requests(behaviour)
    else:
        checked = _unary_request(behaviour, *_names(method))
    return handler._replace(request_deserializer=_tolerant(handler.request_deserializer), **{kind: checked})


def _tolerant(deserializer: Callable[[bytes], object]) -> Callable[[bytes], object]:
    message_type = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    type_name = message_type.full_name if message_type is not None else "request"

    def deserialize(raw: bytes) -> object:
        try:
            return deserializer(raw)
        except Exception:
            return Undecodable(type_name, len(raw))

    return deserialize


def _names(method: str) -> tuple[str, str]:
    """'/inference.v1.EmbeddingService/Embed' -> ('EmbeddingService', 'Embed'): the metrics' labels."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service.rpartition(".")[2], name


async def _refuse(context: grpc.aio.ServicerContext, request: Undecodable, service: str, method: str) -> None:
    call = start_call(service, method, "grpc")
    call.code = grpc.StatusCode.INVALID_ARGUMENT
    call.finish()
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


def _unary_request(behaviour: Callable, service: str, method: str) -> Callable:
    if inspect.isasyncgenfunction(behaviour):

        async def checked_stream(request, context):
            if type(request) is Undecodable:
                await _refuse(context, request, service, method)
            async for response in behaviour(request, context):
                yield response

        return checked_stream

    async def checked(request, context):
        if type(request) is Undecodable:
            await _refuse(context, request, service, method)
        return await behaviour(request, context)

    return checked


def _streaming_requests(behaviour: Callable) -> Callable:
    """The handler counts the call itself (grpc_errors records the abort's code)."""

    async def requests(iterator: AsyncIterator, context: grpc.aio.ServicerContext) -> AsyncIterator:
        async for request in iterator:
            if type(request) is Undecodable:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            yield request

    if inspect.isasyncgenfunction(behaviour):

        async def checked_stream(iterator, context):
            async for response in behaviour(requests(iterator, context), context):
                yield response

        return checked_stream

    async def checked(iterator, context):
        return await behaviour(requests(iterator, context), context)

    return checked
