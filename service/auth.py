"""Who may call: bearer tokens checked in constant time, and the TLS credentials of the gRPC port.

Reusable by every front door. `Tokens` holds the accepted tokens (`--auth-tokens-file`, one per
line, and/or `TS_AUTH_TOKENS`, comma-separated; none configured: all accepted). `Tokens.check`
takes an `authorization` value (`Bearer <token>`) and returns None or the reason it is refused
("missing", "malformed", "invalid"), the `reason` label of `ts_auth_failures_total`; every token
is compared with hmac.compare_digest, so timing leaks neither position nor prefix.
`authenticate_one` refuses two authorization values as malformed on both doors.
`AuthInterceptor` (grpc.aio) answers UNAUTHENTICATED before any handler runs, except for health and
reflection; `server_credentials(settings)` builds TLS (mTLS with `--tls-client-ca`) from PEM files.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from pathlib import Path

import grpc
from prometheus_client import Counter

from service.settings import Settings

log = logging.getLogger(__name__)

AUTH_FAILURES = Counter(
    "ts_auth_failures", "calls refused for a missing, malformed or invalid bearer token", ["protocol", "reason"]
)
# Callable without a token: probes (Kubernetes, load balancers) and tools (grpcurl list/describe).
OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
MESSAGES = {
    "missing": "missing credentials: send the metadata 'authorization: Bearer <token>'",
    "malformed": "malformed credentials: the authorization value must be 'Bearer <token>'",
    "invalid": "invalid token: it is not one of the server's tokens",
}


class Tokens:
    """The accepted bearer tokens; empty = authentication off (every call accepted)."""

    def __init__(self, tokens: Iterable[str] = (), file: str = ""):
        self.file = file
        self._env = [t for t in (t.strip() for t in tokens) if t]
        self._tokens: list[bytes] = []
        self.reload()

    @classmethod
    def from_settings(cls, settings: Settings) -> Tokens:
        return cls(settings.auth_tokens.split(","), settings.auth_tokens_file)

    def reload(self) -> None:
        """Reads the tokens file again (rotation without restart: SIGHUP). OSError when unreadable."""
        tokens = list(self._env)
        if self.file:
            tokens += read_tokens_file(Path(self.file))
        self._tokens = [t.encode() for t in tokens]
        if self.file or self._env:
            log.info("bearer tokens required: %d accepted", len(self._tokens))

    @property
    def enabled(self) -> bool:
        return bool(self._tokens) or bool(self.file)

    def __len__(self) -> int:
        return len(self._tokens)

    def check(self, header_value: str | bytes | None) -> str | None:
        """None when `header_value` ("Bearer <token>") carries an accepted token, else the reason. The
        token is compared as UTF-8 bytes, the tokens file's encoding: an HTTP header's raw bytes as
        they came, gRPC metadata (text) encoded."""
        if not self.enabled:
            return None
        if isinstance(header_value, str):
            header_value = header_value.encode("utf-8", "surrogatepass")
        if not header_value:
            return "missing"
        scheme, _, token = header_value.strip().partition(b" ")
        given = token.strip()
        if scheme.lower() != b"bearer" or not given:
            return "malformed"
        matched = False
        for accepted in self._tokens:  # all of them, always: the time does not depend on which matched
            matched |= hmac.compare_digest(given, accepted)
        return None if matched else "invalid"


def read_tokens_file(path: Path) -> list[str]:
    """One token per line; blank lines and lines starting with # are skipped."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def count_failure(reason: str, protocol: str = "grpc") -> None:
    AUTH_FAILURES.labels(protocol, reason).inc()


def authenticate(tokens: Tokens, header_value: str | bytes | None, protocol: str = "grpc") -> str | None:
    """None when the call may go on; else counts the refusal and returns the message for the client
    (gRPC UNAUTHENTICATED, HTTP 401)."""
    reason = tokens.check(header_value)
    if reason is None:
        return None
    count_failure(reason, protocol)
    return MESSAGES[reason]


def authenticate_one(tokens: Tokens, values: list[str] | list[bytes], protocol: str = "grpc") -> str | None:
    """authenticate for a call that carried `values` as its authorization header(s) or metadata:
    more than one is refused as malformed on both doors (which one would count is ambiguous)."""
    if len(values) > 1 and tokens.enabled:
        count_failure("malformed", protocol)
        return MESSAGES["malformed"]
    return authenticate(tokens, values[0] if values else None, protocol)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without an accepted bearer token (UNAUTHENTICATED) before their handler runs.

    It swaps the method's handler for one that aborts, keeping the method's kind (unary or
    streaming, either side) and (de)serializers, so it covers every RPC of every service."""

    def __init__(self, tokens: Tokens):
        self.tokens = tokens

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_SERVICES):
            return handler
        values = [v for k, v in handler_call_details.invocation_metadata or () if k == "authorization"]
        message = authenticate_one(self.tokens, values)
        if message is None:
            return handler
        log.debug("refused %s: %s", handler_call_details.method, message)
        return _refusing(handler, message)


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def refuse(_request, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from --tls-cert/--tls-key (PEM), requiring client certificates signed by
    --tls-client-ca when given (mTLS); None when TLS is off. OSError when a file is unreadable."""
    if not settings.tls_cert:
        return None
    key, cert = Path(settings.tls_key).read_bytes(), Path(settings.tls_cert).read_bytes()
    client_ca = Path(settings.tls_client_ca).read_bytes() if settings.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )
