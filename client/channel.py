"""Client channels to the service: plaintext or TLS (mTLS with a client certificate), with a bearer token.

    channel = open_channel("host:50051", Credentials(token="s3cret", tls_ca="ca.pem"), options)
    channel = open_channel(address, Credentials.from_env(), options, aio=True)

The token travels as the metadata `authorization: Bearer <token>` on every call, added by a client
interceptor so it works on plaintext channels too (grpc's call credentials need TLS), e.g. behind
a proxy that terminates TLS. Environment: TS_TOKEN, TS_TLS_CA, TS_TLS_CLIENT_CERT, TS_TLS_CLIENT_KEY,
TS_TLS_SERVER_NAME (the name to check the server's certificate against, when it differs from the
address's host: a probe calling 127.0.0.1 of a pod whose certificate names the Service).
"""

from __future__ import annotations

import argparse
import collections
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

ENV = {
    "token": "TS_TOKEN",
    "tls_ca": "TS_TLS_CA",
    "tls_cert": "TS_TLS_CLIENT_CERT",
    "tls_key": "TS_TLS_CLIENT_KEY",
    "server_name": "TS_TLS_SERVER_NAME",
}


@dataclass(frozen=True)
class Credentials:
    """What a client presents: a bearer token, the CA that signed the server's certificate (turns
    TLS on), a client certificate and key (mTLS). Empty strings = not used."""

    token: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    server_name: str = ""

    def __repr__(self) -> str:  # never print the token
        return f"Credentials(token={'***' if self.token else ''!r}, tls_ca={self.tls_ca!r}, tls_cert={self.tls_cert!r})"

    @classmethod
    def from_env(cls, env: os._Environ | dict | None = None) -> Credentials:
        env = os.environ if env is None else env
        return cls(**{name: env.get(var, "") for name, var in ENV.items()})

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Credentials:
        return cls(args.token, args.tls_ca, args.tls_client_cert, args.tls_client_key, args.tls_server_name)

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--token, --tls-ca, --tls-client-cert, --tls-client-key (defaults from the TS_* variables)."""
    env = Credentials.from_env()
    group = parser.add_argument_group("security (docs/design/security.md)")
    group.add_argument(
        "--token",
        default=env.token,
        help="bearer token sent as 'authorization: Bearer <token>' (env TS_TOKEN: safer than a flag)",
    )
    group.add_argument(
        "--tls-ca", default=env.tls_ca, help="PEM CA of the server's certificate; turns TLS on (env TS_TLS_CA)"
    )
    group.add_argument(
        "--tls-client-cert", default=env.tls_cert, help="PEM client certificate for mTLS (env TS_TLS_CLIENT_CERT)"
    )
    group.add_argument(
        "--tls-client-key", default=env.tls_key, help="PEM key of --tls-client-cert (env TS_TLS_CLIENT_KEY)"
    )
    group.add_argument(
        "--tls-server-name",
        default=env.server_name,
        help="name the server's certificate must carry, when not the address's host (env TS_TLS_SERVER_NAME)",
    )


def open_channel(
    address: str, credentials: Credentials = Credentials(), options: list | None = None, aio: bool = False
) -> grpc.Channel | grpc.aio.Channel:
    """A sync (or grpc.aio) channel to address presenting these credentials on every call."""
    options = list(options or [])
    if credentials.server_name:
        options.append(("grpc.ssl_target_name_override", credentials.server_name))
    tls = _channel_credentials(credentials) if credentials.tls else None
    if aio:
        interceptors = _aio_interceptors(credentials.token) if credentials.token else None
        if tls is not None:
            return grpc.aio.secure_channel(address, tls, options=options, interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    channel = grpc.secure_channel(address, tls, options=options) if tls else grpc.insecure_channel(address, options)
    return grpc.intercept_channel(channel, _Token(credentials.token)) if credentials.token else channel


def _channel_credentials(credentials: Credentials) -> grpc.ChannelCredentials:
    """TLS from PEM files (OSError when one is unreadable); no CA file = the system's roots."""

    def read(path: str) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return grpc.ssl_channel_credentials(
        root_certificates=read(credentials.tls_ca),
        private_key=read(credentials.tls_key),
        certificate_chain=read(credentials.tls_cert),
    )


def _bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class _Token(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the bearer token to every call of a sync channel."""

    def __init__(self, token: str):
        self._metadata = _bearer(token)

    def _details(self, d: grpc.ClientCallDetails) -> _Details:
        return _Details(
            d.method,
            d.timeout,
            [*(d.metadata or ()), self._metadata],
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    intercept_unary_stream = intercept_stream_unary = intercept_stream_stream = intercept_unary_unary


class _AioToken:
    """Adds the bearer token to every call of a grpc.aio channel. grpc.aio files each interceptor
    under one call kind only (the first base class it matches), so there is one subclass per kind."""

    def __init__(self, token: str):
        self._metadata = _bearer(token)

    async def _intercept(self, continuation, details, request):
        metadata = grpc.aio.Metadata(*tuple(details.metadata or ()), self._metadata)
        return await continuation(details._replace(metadata=metadata), request)


class _AioUnaryUnary(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _AioToken._intercept


class _AioUnaryStream(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _AioToken._intercept


class _AioStreamUnary(_AioToken, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _AioToken._intercept


class _AioStreamStream(_AioToken, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _AioToken._intercept


def _aio_interceptors(token: str) -> list[_AioToken]:
    return [kind(token) for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)]
