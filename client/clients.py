"""The Python clients: sync `Client` and asyncio `AsyncClient` over one gRPC channel each.

    with Client("127.0.0.1:50051") as c:
        vectors = c.embed(["a sentence", "another"])          # list of lists of floats
        matrix = c.embed_array(["a sentence", "another"])      # (2, D) float32, sent packed
        response = c.embed_response(["a sentence"], dimensions=128)   # the EmbedResponse
        filled = c.fill_mask(["The cat sat on the [MASK]."], top_k=5)   # the FillMaskResponse
        text = c.generate("Once upon a time", max_new_tokens=50).text   # client/generation.py
        pairs = c.translate(["Hello."], beam_size=4)                  # client/translation.py
        ranked = c.rerank("a query", ["doc one", "doc two"], top_n=1)   # client/classification.py
        labels = c.classify(["a text", ("a text", "its pair")])        # the ClassifyResponse
        sparse = c.embed_sparse(["a text"]).embeddings[0]   # SPLADE: .indices, .values (non-zero)
    async with AsyncClient("127.0.0.1:50051") as c:
        vectors = await c.embed(["a sentence"])
    Client("host:50051", token="...", tls_ca="ca.pem")   # TLS + bearer token (docs/design/security.md)

Only the generated stubs (`service.proto`, the public contract) are shared with the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Iterator
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import channel as channels
from client.classification import AsyncClassificationClientMixin, ClassificationClientMixin
from client.generation import AsyncGenerationClientMixin, GenerationClientMixin
from client.translation import AsyncTranslationClientMixin, TranslationClientMixin
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def embed_request(
    inputs: Iterable[str],
    model: str = "",
    normalize: bool | None = None,
    truncate: bool | None = None,
    dimensions: int = 0,
    request_id: str = "",
    packed: bool = False,
    prompt_name: str = "",
    prompt: str | None = None,
) -> pb.EmbedRequest:
    """An EmbedRequest; `packed` asks for the vectors as little-endian float32 bytes (Embedding.packed);
    `prompt_name` (one of the model's instruction prompts) or `prompt` (the prefix text) goes before each input."""
    request = pb.EmbedRequest(
        inputs=list(inputs),
        model=model,
        dimensions=dimensions,
        request_id=request_id,
        encoding=pb.EMBEDDING_ENCODING_PACKED_FLOAT32 if packed else pb.EMBEDDING_ENCODING_FLOAT,
        prompt_name=prompt_name,
    )
    if prompt is not None:
        request.prompt = prompt
    if normalize is not None:
        request.normalize = normalize
    if truncate is not None:
        request.truncate = truncate
    return request


def fill_mask_request(inputs: Iterable[str], model: str = "", top_k: int = 0) -> pb.FillMaskRequest:
    """A FillMaskRequest: each input holds one or more [MASK]; top_k 0 is the server's default (5)."""
    return pb.FillMaskRequest(inputs=list(inputs), model=model, top_k=top_k)


def array(response: pb.EmbedResponse) -> np.ndarray:
    """An EmbedResponse's vectors as one (N, D) float32 array, whichever way they travelled
    (packed: little-endian float32 bytes, the contract's EMBEDDING_ENCODING_PACKED_FLOAT32)."""
    rows = len(response.embeddings)
    if rows and response.embeddings[0].packed:
        data = np.frombuffer(b"".join(e.packed for e in response.embeddings), dtype="<f4")
        return data.astype(np.float32, copy=False).reshape(rows, -1)
    return np.array([e.values for e in response.embeddings], dtype=np.float32).reshape(rows, -1)


def vectors(response: pb.EmbedResponse) -> list[list[float]]:
    return array(response).tolist()


class _Stubs:
    """One stub per service of the contract, on one channel (sync or grpc.aio)."""

    def _bind(self, channel: grpc.Channel | grpc.aio.Channel) -> None:
        self.embedding_stub = pb_grpc.EmbeddingServiceStub(channel)
        self.model_stub = pb_grpc.ModelServiceStub(channel)
        self.fill_mask_stub = pb_grpc.FillMaskServiceStub(channel)
        self.generation_stub = pb_grpc.GenerationServiceStub(channel)
        self.translation_stub = pb_grpc.TranslationServiceStub(channel)
        self.inspection_stub = pb_grpc.InspectionServiceStub(channel)
        self.classification_stub = pb_grpc.ClassificationServiceStub(channel)
        self.sparse_stub = pb_grpc.SparseEmbeddingServiceStub(channel)
        self.health_stub = health_pb2_grpc.HealthStub(channel)


def _channel_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


class Client(_Stubs, GenerationClientMixin, TranslationClientMixin, ClassificationClientMixin):
    """Blocking client; `timeout` (seconds) is the deadline of every call. `token`: bearer token;
    `tls_ca`: PEM CA of the server's certificate (TLS on); `tls_cert`/`tls_key`: client certificate (mTLS);
    `credentials`: all of these at once (client/channel.py), e.g. `Credentials.from_env()`."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        timeout: float | None = 30.0,
        token: str = "",
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
        credentials: channels.Credentials | None = None,
    ):
        self.address, self.timeout = address, timeout
        self.credentials = credentials or channels.Credentials(token, tls_ca, tls_cert, tls_key)
        self.channel = channels.open_channel(address, self.credentials, _channel_options())
        self._bind(self.channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def embed_response(self, inputs: Iterable[str], **kwargs: Any) -> pb.EmbedResponse:
        return self.embedding_stub.Embed(embed_request(inputs, **kwargs), timeout=self.timeout)

    def embed(self, inputs: Iterable[str], **kwargs: Any) -> list[list[float]]:
        """Embeddings of inputs, in order (kwargs: embed_request's; sent packed)."""
        return vectors(self.embed_response(inputs, **{"packed": True, **kwargs}))

    def embed_array(self, inputs: Iterable[str], **kwargs: Any) -> np.ndarray:
        """Embeddings of inputs as one (N, D) float32 array (sent packed)."""
        return array(self.embed_response(inputs, **{"packed": True, **kwargs}))

    def embed_stream(self, requests: Iterable[pb.EmbedRequest]) -> Iterator[pb.EmbedResponse]:
        """One response per request, in order (for batch jobs; no per-call deadline)."""
        return self.embedding_stub.EmbedStream(iter(requests))

    def embed_sparse(self, inputs: Iterable[str], **kwargs: Any) -> pb.EmbedSparseResponse:
        """Each input's non-zero vocabulary weights (a sparse-embedding model; kwargs: EmbedSparseRequest's)."""
        return self.sparse_stub.EmbedSparse(pb.EmbedSparseRequest(inputs=list(inputs), **kwargs), timeout=self.timeout)

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


class AsyncClient(_Stubs, AsyncGenerationClientMixin, AsyncTranslationClientMixin, AsyncClassificationClientMixin):
    """asyncio client (grpc.aio); same arguments and methods as Client, awaited."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        timeout: float | None = 30.0,
        token: str = "",
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
        credentials: channels.Credentials | None = None,
    ):
        self.address, self.timeout = address, timeout
        self.credentials = credentials or channels.Credentials(token, tls_ca, tls_cert, tls_key)
        self.channel = channels.open_channel(address, self.credentials, _channel_options(), aio=True)
        self._bind(self.channel)

    async def __aenter__(self) -> AsyncClient:
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

    async def embed_sparse(self, inputs: Iterable[str], **kwargs: Any) -> pb.EmbedSparseResponse:
        request = pb.EmbedSparseRequest(inputs=list(inputs), **kwargs)
        return await self.sparse_stub.EmbedSparse(request, timeout=self.timeout)

    async def fill_mask(self, inputs: Iterable[str], **kwargs: Any) -> pb.FillMaskResponse:
        return await self.fill_mask_stub.FillMask(fill_mask_request(inputs, **kwargs), timeout=self.timeout)

    async def models(self) -> list[pb.ModelInfo]:
        return list((await self.model_stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)).models)

    async def model(self, name: str) -> pb.ModelInfo:
        return await self.model_stub.GetModel(pb.GetModelRequest(name=name), timeout=self.timeout)

    async def health(self, service: str = "") -> str:
        reply = await self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
