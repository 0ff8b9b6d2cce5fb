"""Python clients (sync `Client`, asyncio `AsyncClient`) and the CLI `python -m service.client`.

    with Client("127.0.0.1:50051") as c:
        vectors = c.embed(["a sentence", "another"])          # list of lists of floats
        matrix = c.embed_array(["a sentence", "another"])      # (2, D) float32, sent packed
        response = c.embed_response(["a sentence"], dimensions=128)   # the EmbedResponse
        filled = c.fill_mask(["The cat sat on the [MASK]."], top_k=5)   # the FillMaskResponse
    async with AsyncClient("127.0.0.1:50051") as c:
        vectors = await c.embed(["a sentence"])
    Client("host:50051", token="...", tls_ca="ca.pem")   # TLS + bearer token (docs/design/security.md)

CLI (prints JSON): `embed TEXT...`, `fill-mask TEXT... [--top-k K] [--json]` (a table unless
--json), `models [NAME]`, `health [--service S]`, and `generate` /
`translate`, whose parsers and client methods live in service/textgen/client.py (mixins), and
`attention` (pictures or JSON; service/inspection/client.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import AsyncIterable, Iterable, Iterator
from typing import Any

import grpc
import numpy as np
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service import channel as channels
from service.batch.cli import add_batch_parser
from service.inspection.client import add_attention_parser
from service.packing import array
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.textgen.client import (
    AsyncGenerationClientMixin,
    GenerationClientMixin,
    add_generate_parser,
    add_translate_parser,
)

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def embed_request(inputs: Iterable[str], model: str = "", normalize: bool | None = None, truncate: bool | None = None,
                  dimensions: int = 0, request_id: str = "", packed: bool = False) -> pb.EmbedRequest:
    """An EmbedRequest; `packed` asks for the vectors as little-endian float32 bytes (Embedding.packed)."""
    request = pb.EmbedRequest(inputs=list(inputs), model=model, dimensions=dimensions, request_id=request_id,
                              encoding=pb.EMBEDDING_ENCODING_PACKED_FLOAT32 if packed else pb.EMBEDDING_ENCODING_FLOAT)
    if normalize is not None:
        request.normalize = normalize
    if truncate is not None:
        request.truncate = truncate
    return request


def fill_mask_request(inputs: Iterable[str], model: str = "", top_k: int = 0) -> pb.FillMaskRequest:
    """A FillMaskRequest: each input holds one or more [MASK]; top_k 0 is the server's default (5)."""
    return pb.FillMaskRequest(inputs=list(inputs), model=model, top_k=top_k)


def vectors(response: pb.EmbedResponse) -> list[list[float]]:
    return array(response).tolist()


def _stubs(obj: Any, channel: grpc.Channel | grpc.aio.Channel) -> None:
    obj.embedding_stub = pb_grpc.EmbeddingServiceStub(channel)
    obj.model_stub = pb_grpc.ModelServiceStub(channel)
    obj.fill_mask_stub = pb_grpc.FillMaskServiceStub(channel)
    obj.generation_stub = pb_grpc.GenerationServiceStub(channel)
    obj.translation_stub = pb_grpc.TranslationServiceStub(channel)
    obj.inspection_stub = pb_grpc.InspectionServiceStub(channel)
    obj.health_stub = health_pb2_grpc.HealthStub(channel)


def _channel_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


class Client(GenerationClientMixin):
    """Blocking client; `timeout` (seconds) is the deadline of every call. `token`: bearer token;
    `tls_ca`: PEM CA of the server's certificate (TLS on); `tls_cert`/`tls_key`: client certificate (mTLS);
    `credentials`: all of these at once (service/channel.py), e.g. `Credentials.from_env()`."""

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float | None = 30.0, token: str = "",
                 tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
                 credentials: channels.Credentials | None = None):
        self.address, self.timeout = address, timeout
        self.credentials = credentials or channels.Credentials(token, tls_ca, tls_cert, tls_key)
        self.channel = channels.open_channel(address, self.credentials, _channel_options())
        _stubs(self, self.channel)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def embed_response(self, inputs: Iterable[str], **kwargs: Any) -> pb.EmbedResponse:
        return self.embedding_stub.Embed(embed_request(inputs, **kwargs), timeout=self.timeout)

    def embed(self, inputs: Iterable[str], **kwargs: Any) -> list[list[float]]:
        """Embeddings of inputs, in order (kwargs: model, normalize, truncate, dimensions; sent packed)."""
        return vectors(self.embed_response(inputs, **{"packed": True, **kwargs}))

    def embed_array(self, inputs: Iterable[str], **kwargs: Any) -> np.ndarray:
        """Embeddings of inputs as one (N, D) float32 array (sent packed)."""
        return array(self.embed_response(inputs, **{"packed": True, **kwargs}))

    def embed_stream(self, requests: Iterable[pb.EmbedRequest]) -> Iterator[pb.EmbedResponse]:
        """One response per request, in order (for batch jobs; no per-call deadline)."""
        return self.embedding_stub.EmbedStream(iter(requests))

    def fill_mask(self, inputs: Iterable[str], **kwargs: Any) -> pb.FillMaskResponse:
        """Candidates for every [MASK] of every input (kwargs: model, top_k)."""
        return self.fill_mask_stub.FillMask(fill_mask_request(inputs, **kwargs), timeout=self.timeout)

    def models(self) -> list[pb.ModelInfo]:
        return list(self.model_stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout).models)

    def model(self, name: str) -> pb.ModelInfo:
        return self.model_stub.GetModel(pb.GetModelRequest(name=name), timeout=self.timeout)

    def health(self, service: str = "") -> str:
        """SERVING | NOT_SERVING | SERVICE_UNKNOWN ... for service ("" = the whole server)."""
        reply = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


class AsyncClient(AsyncGenerationClientMixin):
    """asyncio client (grpc.aio); same arguments and methods as Client, awaited."""

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float | None = 30.0, token: str = "",
                 tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
                 credentials: channels.Credentials | None = None):
        self.address, self.timeout = address, timeout
        self.credentials = credentials or channels.Credentials(token, tls_ca, tls_cert, tls_key)
        self.channel = channels.open_channel(address, self.credentials, _channel_options(), aio=True)
        _stubs(self, self.channel)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def embed_response(self, inputs: Iterable[str], **kwargs: Any) -> pb.EmbedResponse:
        return await self.embedding_stub.Embed(embed_request(inputs, **kwargs), timeout=self.timeout)

    async def embed(self, inputs: Iterable[str], **kwargs: Any) -> list[list[float]]:
        return vectors(await self.embed_response(inputs, **{"packed": True, **kwargs}))

    async def embed_array(self, inputs: Iterable[str], **kwargs: Any) -> np.ndarray:
        return array(await self.embed_response(inputs, **{"packed": True, **kwargs}))

    def embed_stream(self, requests: AsyncIterable[pb.EmbedRequest] | Iterable[pb.EmbedRequest]):
        """An async iterator of responses, one per request, in order."""
        return self.embedding_stub.EmbedStream(requests)

    async def fill_mask(self, inputs: Iterable[str], **kwargs: Any) -> pb.FillMaskResponse:
        return await self.fill_mask_stub.FillMask(fill_mask_request(inputs, **kwargs), timeout=self.timeout)

    async def models(self) -> list[pb.ModelInfo]:
        return list((await self.model_stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)).models)

    async def model(self, name: str) -> pb.ModelInfo:
        return await self.model_stub.GetModel(pb.GetModelRequest(name=name), timeout=self.timeout)

    async def health(self, service: str = "") -> str:
        reply = await self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


# ------------------------------------------------------------------------------------------------
# CLI


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def _cmd_embed(args: argparse.Namespace, client: Client) -> int:
    response = client.embed_response(args.texts, model=args.model, normalize=args.normalize,
                                     truncate=args.truncate, dimensions=args.dimensions, packed=args.packed)
    _print_json(MessageToDict(response, preserving_proto_field_name=True))
    return 0


def _cmd_fill_mask(args: argparse.Namespace, client: Client) -> int:
    response = client.fill_mask(args.texts, model=args.model, top_k=args.top_k)
    if args.json:
        _print_json(MessageToDict(response, preserving_proto_field_name=True))
        return 0
    for text, result in zip(args.texts, response.results, strict=True):
        sys.stdout.write(f"{text}\n")
        for m, mask in enumerate(result.masks):
            for c in mask.candidates:
                sys.stdout.write(f"  mask {m}  {c.score:.4f}  {c.token!r:<16} {c.sequence}\n")
    return 0


def _cmd_models(args: argparse.Namespace, client: Client) -> int:
    if args.name:
        _print_json(MessageToDict(client.model(args.name), preserving_proto_field_name=True))
    else:
        _print_json([MessageToDict(m, preserving_proto_field_name=True) for m in client.models()])
    return 0


def _cmd_health(args: argparse.Namespace, client: Client) -> int:
    status = client.health(args.service)
    _print_json({"service": args.service, "status": status})
    return 0 if status == "SERVING" else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m service.client", description="transformer-serving client")
    parser.add_argument("--address", default=DEFAULT_ADDRESS, help=f"host:port of the service ({DEFAULT_ADDRESS})")
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline of the call, seconds")
    channels.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    embed = sub.add_parser("embed", help="embed texts; prints the EmbedResponse as JSON")
    embed.add_argument("texts", nargs="+")
    embed.add_argument("--model", default="", help="model name (default: the server's default)")
    embed.add_argument("--dimensions", type=int, default=0, help="keep the first N values (0: all)")
    embed.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None)
    embed.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=None)
    embed.add_argument("--packed", action="store_true", help="ask for packed float32 bytes (printed as base64)")
    embed.set_defaults(handler=_cmd_embed)
    fill = sub.add_parser("fill-mask", help="predict the [MASK] tokens of texts; prints candidates best first")
    fill.add_argument("texts", nargs="+", help='texts holding one or more [MASK], e.g. "The cat sat on the [MASK]."')
    fill.add_argument("--model", default="", help="model name (default: the server's default)")
    fill.add_argument("--top-k", type=int, default=0, help="candidates per mask (0: 5)")
    fill.add_argument("--json", action="store_true", help="print the FillMaskResponse as JSON")
    fill.set_defaults(handler=_cmd_fill_mask)
    models = sub.add_parser("models", help="list the served models, or show one")
    models.add_argument("name", nargs="?", default="")
    models.set_defaults(handler=_cmd_models)
    health = sub.add_parser("health", help="health status; exit code 0 when SERVING")
    health.add_argument("--service", default="", help='e.g. inference.v1.EmbeddingService ("" = overall)')
    health.set_defaults(handler=_cmd_health)
    add_generate_parser(sub)  # service/textgen/client.py: each sets handler(args, client) -> int
    add_translate_parser(sub)
    add_batch_parser(sub)  # service/batch/cli.py: resumable batch embedding of a large file
    add_attention_parser(sub)  # service/inspection/client.py: attention maps as pictures or JSON
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with Client(args.address, args.timeout, credentials=channels.Credentials.from_args(args)) as client:
        try:
            return args.handler(args, client)
        except grpc.RpcError as e:
            sys.stderr.write(f"error: {e.code().name}: {e.details()}\n")
            return 2


if __name__ == "__main__":
    sys.exit(main())
