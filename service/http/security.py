"""Bearer tokens and TLS on the HTTP door: the same tokens and certificates as gRPC's.

`BearerAuth` is a pure ASGI middleware: when tokens are configured (service/auth.py, the very
`Tokens` object the gRPC interceptor uses, so SIGHUP reloads both doors) every route but the
probes (`/health`, KServe's `/v2/health/live` and `/v2/health/ready`) needs `Authorization: Bearer
<token>` (the openai SDK's `api_key`); a missing or wrong one, or two `Authorization` headers (gRPC
refuses two values too), gets 401 in OpenAI's error shape with `WWW-Authenticate: Bearer`, counted
in `ts_auth_failures_total{protocol="http"}`, before the route runs. `ssl_options(settings)` gives
uvicorn the certificate, key and, for mTLS, the client CA that gRPC uses.
"""

from __future__ import annotations

import ssl

import grpc

from service.auth import Tokens, authenticate_one
from service.http.errors import error_response
from service.settings import Settings

OPEN_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready"})  # probes, as gRPC health stays open


class BearerAuth:
    def __init__(self, app, tokens: Tokens):
        self.app, self.tokens = app, tokens

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        message = authenticate_one(self.tokens, values, protocol="http")
        if message is None:
            await self.app(scope, receive, send)
            return
        response = error_response(grpc.StatusCode.UNAUTHENTICATED, message)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


def ssl_options(settings: Settings) -> dict:
    """uvicorn.Config keyword arguments for TLS (mTLS with a client CA); {} when TLS is off."""
    if not settings.tls_cert:
        return {}
    options: dict[str, object] = {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
    if settings.tls_client_ca:
        options.update(ssl_ca_certs=settings.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options
