"""One exception family for client-visible failures, mapped to gRPC status codes in one place.

Code below a door raises a `ServiceError` subclass whose message says what was wrong and how to fix
it; `@grpc_errors(service)` on each RPC handler (unary or streaming) aborts with its code and
records the call's metrics. Anything else is a bug: logged with its traceback, answered INTERNAL
with a generic message. Handlers call `label_model(name)` once the model is known (before that the
label is "-", so arbitrary names cannot grow the label set). Messages are bounded (`quote`,
MESSAGE_BYTES): docs/design/robustness.md says why.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Callable

import grpc

from service import metrics

log = logging.getLogger(__name__)

QUOTE_CHARS = 64  # characters of a request value quoted in a message
MESSAGE_BYTES = 1024  # UTF-8 bytes of a message at most; percent-encoded <= 3 KiB, far below 8 KiB

_CURRENT_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("ts_current_call", default=None)


class ServiceError(Exception):
    """A failure the client can act on; `code` is the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def quote(value: str, limit: int = QUOTE_CHARS) -> str:
    """repr(value), cut to `limit` characters with the full length stated: 'abc…' (20000 characters)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit] + '…'!r} ({len(value)} characters)"


def bounded(message: str, limit: int = MESSAGE_BYTES) -> str:
    """message cut to at most `limit` UTF-8 bytes (on a character boundary), saying it was cut."""
    data = message.encode("utf-8", "replace")  # "replace": a lone surrogate would make grpc's encoding fail
    if len(data) <= limit:
        return data.decode("utf-8")
    note = f"… (message cut; {len(data)} bytes in full)"
    head = data[: limit - len(note.encode())].decode("utf-8", "ignore")
    return head + note


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ServiceError):
    code = grpc.StatusCode.CANCELLED


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION


def label_model(name: str) -> None:
    """Labels the current RPC's metrics with the model that serves it (no-op outside a handler)."""
    call = _CURRENT_CALL.get()
    if call is not None:
        call.model = name


class _Call:
    """Bookkeeping of one RPC: its status code and metric labels."""

    def __init__(self, service: str, method: str, request: object, protocol: str = "grpc"):
        self.service, self.method, self.protocol = service, method, protocol
        self.start = time.perf_counter()
        self.code = grpc.StatusCode.OK
        self.model = "-"  # until label_model: never the raw request field (unbounded label values)
        _CURRENT_CALL.set(self)  # each grpc.aio handler runs in its own task, so its own context

    def interrupted(self, context: grpc.aio.ServicerContext) -> None:
        """The call was cancelled: by its deadline when no time is left, else by the client."""
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= 0
        self.code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED

    def aborted(self, context: grpc.aio.ServicerContext) -> None:
        """The handler called context.abort itself; keep the code it gave."""
        if self.code == grpc.StatusCode.OK:
            self.code = context.code() or grpc.StatusCode.UNKNOWN

    def fail(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        """Sets the status and message exc maps to; the handler then ends without an answer, which
        grpc sends as that status. Not `context.abort`: grpc keeps the last call's AbortError, whose
        traceback holds every frame of the call, and so the request in them (and, chained, exc's): a
        refused 15 MB request stayed resident until the next call."""
        if isinstance(exc, ServiceError):
            self.code, message = exc.code, bounded(exc.message)
        else:
            self.code, message = grpc.StatusCode.INTERNAL, "internal error (logged on the server)"
            log.error("%s/%s failed", self.service, self.method, exc_info=exc)
        context.set_code(self.code)
        context.set_details(message)

    def finish(self) -> None:
        count, duration = _series(self.service, self.method, self.model, self.code.name, self.protocol)
        count.inc()
        duration.observe(time.perf_counter() - self.start)


@functools.lru_cache(maxsize=4096)
def _series(service: str, method: str, model: str, code: str, protocol: str) -> tuple:
    """The labelled children of one call's metrics, resolved once (labels() costs microseconds a call;
    label values are bounded: model names are resolved ones or "-")."""
    return (
        metrics.REQUESTS.labels(service, method, model, code, protocol),
        metrics.REQUEST_DURATION.labels(service, method, model, protocol),
    )


def start_call(service: str, method: str, protocol: str) -> _Call:
    """The bookkeeping of one call that came by another door (HTTP, service/http/errors.py): the
    caller's task then has `label_model`; the caller sets `.code` and calls `.finish()`."""
    return _Call(service, method, None, protocol)


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """A gRPC call's deadline as a time.monotonic() instant, what the cores take (None: no deadline)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def grpc_errors(service: str) -> Callable:
    """Decorator for grpc.aio handlers (coroutines, or async generators for streaming responses)."""

    def wrap(fn: Callable) -> Callable:
        if inspect.isasyncgenfunction(fn):
            return _wrap_stream(service, fn)
        if inspect.iscoroutinefunction(fn):
            return _wrap_unary(service, fn)
        raise TypeError(f"grpc_errors: {fn.__qualname__} must be async def (or an async generator)")

    return wrap


def _wrap_unary(service: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    async def handler(self, request, context):
        call = _Call(service, fn.__name__, request)
        try:
            return await fn(self, request, context)
        except asyncio.CancelledError:
            call.interrupted(context)
            raise
        except grpc.aio.AbortError:
            call.aborted(context)
            raise
        except Exception as exc:
            call.fail(context, exc)
            return None
        finally:
            call.finish()

    return handler


def _wrap_stream(service: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    async def handler(self, request, context):
        call = _Call(service, fn.__name__, request)
        try:
            async for item in fn(self, request, context):
                yield item
        except (asyncio.CancelledError, GeneratorExit):  # GeneratorExit: grpc closed the stream early
            call.interrupted(context)
            raise
        except grpc.aio.AbortError:
            call.aborted(context)
            raise
        except Exception as exc:
            call.fail(context, exc)
        finally:
            call.finish()

    return handler
