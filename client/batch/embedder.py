"""Embeds one chunk through `EmbedStream`, with retries, backoff and per-item failure isolation.

A chunk's valid items are cut into requests of `batch_size` texts, written on one EmbedStream
with at most `window` requests awaiting their response (the server answers in order). When the
stream breaks:
- UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED: wait (exponential backoff with jitter) and
  open a new stream from the first request without a response; `max_retries` failures in a row
  with no progress fail the job.
- NOT_FOUND, UNIMPLEMENTED, PERMISSION_DENIED, UNAUTHENTICATED: the job cannot work; fail it.
- anything else (INVALID_ARGUMENT: an empty or too long text): the first request without a
  response is resent one text per unary Embed call; texts that still fail are recorded as
  failures (id, status code, message) and the stream resumes after that request.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, cast

import grpc
import numpy as np

from client.batch.sources import Chunk, Item
from client.clients import array
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
)
FATAL = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
PROBE_TEXT = "transformer-serving batch probe"


class BatchFailed(RuntimeError):
    """The job cannot go on (server unreachable after retries, unknown model, bad options)."""


@dataclass
class ChunkResult:
    index: int
    ids: list[Any]
    vectors: np.ndarray  # (n, D) float32, row i for ids[i]
    failures: list[dict[str, Any]]  # {"id", "code", "message"}


@dataclass(frozen=True)
class EmbedOptions:
    model: str = ""
    normalize: bool | None = None
    truncate: bool | None = None
    dimensions: int = 0
    batch_size: int = 32
    window: int = 4  # requests awaiting a response on one stream
    max_retries: int = 8  # failed attempts in a row, without progress, before giving up
    backoff_base: float = 0.5  # seconds; doubles per failed attempt
    backoff_max: float = 30.0
    timeout: float | None = 600.0  # deadline of one stream attempt (one chunk), seconds


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with jitter: uniform in [d/2, d], d = min(cap, base * 2**(attempt-1))."""
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return random.uniform(delay / 2, delay)


class ChunkEmbedder:
    def __init__(self, stub: pb_grpc.EmbeddingServiceStub, options: EmbedOptions):
        self.stub, self.options = stub, options
        self.dim = 0
        self.model = options.model

    def request(self, texts: list[str], request_id: str = "") -> pb.EmbedRequest:
        o = self.options
        req = pb.EmbedRequest(
            inputs=texts,
            model=o.model,
            dimensions=o.dimensions,
            request_id=request_id,
            encoding=pb.EMBEDDING_ENCODING_PACKED_FLOAT32,
        )
        if o.normalize is not None:
            req.normalize = o.normalize
        if o.truncate is not None:
            req.truncate = o.truncate
        return req

    async def probe(self) -> int:
        """One Embed call with the job's options: checks them, learns the dimension and model name."""
        try:
            response = await self._unary(PROBE_TEXT)
        except grpc.aio.AioRpcError as e:
            raise BatchFailed(f"the server refused the job's options: {e.code().name}: {e.details()}") from e
        self.dim = array(response).shape[1]
        self.model = response.model or self.options.model
        return self.dim

    async def embed(self, chunk: Chunk) -> ChunkResult:
        valid = [it for it in chunk.items if it.text is not None]
        failures = [
            {"id": it.id, "code": "INVALID_INPUT", "message": it.error} for it in chunk.items if it.text is None
        ]
        size = self.options.batch_size
        batches = [valid[i : i + size] for i in range(0, len(valid), size)]
        results: list[Any] = [None] * len(batches)  # (ids, (n, D) vectors) per batch, every slot filled by _fill
        await self._fill(chunk.index, batches, results, failures)
        ids = [i for r in results for i in r[0]]
        vectors = np.concatenate([r[1] for r in results]) if results else np.zeros((0, self.dim), np.float32)
        return ChunkResult(chunk.index, ids, vectors.reshape(len(ids), self.dim), failures)

    async def _fill(self, index: int, batches: list[list[Item]], results: list, failures: list[dict]) -> None:
        pos, attempt = 0, 0
        while pos < len(batches):
            start = pos
            try:
                pos = await self._stream(index, batches, results, pos)
            except grpc.aio.AioRpcError as e:
                pos = next((k for k in range(start, len(batches)) if results[k] is None), len(batches))
                code = e.code()
                if code in FATAL:
                    raise BatchFailed(f"chunk {index}: {code.name}: {e.details()}") from e
                if code in RETRYABLE:
                    attempt = 1 if pos > start else attempt + 1
                    await self._wait(attempt, f"chunk {index}", e)
                    continue
                log.info("chunk %d request %d: %s (%s); isolating its items", index, pos, code.name, e.details())
                results[pos] = await self._isolate(batches[pos], failures)
                pos += 1

    async def _stream(self, index: int, batches: list[list[Item]], results: list, pos: int) -> int:
        """Streams batches[pos:], filling results; returns len(batches) or raises AioRpcError."""
        call = self.stub.EmbedStream(timeout=self.options.timeout)
        window = asyncio.Semaphore(self.options.window)

        async def write() -> None:
            for k in range(pos, len(batches)):
                await window.acquire()
                await call.write(self.request([cast(str, it.text) for it in batches[k]], f"{index}:{k}"))
            await call.done_writing()

        writer = asyncio.ensure_future(write())
        try:
            for k in range(pos, len(batches)):
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise BatchFailed(
                        f"chunk {index}: the stream ended after {k - pos} of {len(batches) - pos} responses"
                    )
                if response.request_id and response.request_id != f"{index}:{k}":
                    raise BatchFailed(
                        f"chunk {index}: response {response.request_id!r} out of order (expected {index}:{k})"
                    )
                results[k] = ([it.id for it in batches[k]], self._vectors(response, len(batches[k])))
                window.release()
            if await call.read() is not grpc.aio.EOF:  # the server ends the call once all are answered
                raise BatchFailed(f"chunk {index}: more responses than requests")
            await writer
            return len(batches)
        except BaseException:
            call.cancel()
            raise
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    def _vectors(self, response: pb.EmbedResponse, expected: int) -> np.ndarray:
        vectors = array(response).reshape(-1, self.dim)  # packed float32 bytes
        if vectors.shape[0] != expected:
            raise BatchFailed(f"the server returned {vectors.shape[0]} embeddings for {expected} inputs")
        return vectors  # (n, D)

    async def _isolate(self, batch: list[Item], failures: list[dict]) -> tuple[list[Any], np.ndarray]:
        """Embeds a rejected request's texts one by one; records the ones the server refuses."""
        ids, vectors = [], []
        for item in batch:
            try:
                response = await self._unary(cast(str, item.text))
            except grpc.aio.AioRpcError as e:
                if e.code() in FATAL or e.code() in RETRYABLE:
                    raise BatchFailed(f"item {item.id!r}: {e.code().name}: {e.details()}") from e
                failures.append({"id": item.id, "code": e.code().name, "message": e.details()})
                continue
            ids.append(item.id)
            vectors.append(self._vectors(response, 1))
        stacked = np.concatenate(vectors) if vectors else np.zeros((0, self.dim), np.float32)
        return ids, stacked

    async def _unary(self, text: str) -> pb.EmbedResponse:
        """One-text Embed with retries on the retryable codes; raises the last AioRpcError."""
        attempt = 0
        while True:
            try:
                return await self.stub.Embed(self.request([text]), timeout=self.options.timeout)
            except grpc.aio.AioRpcError as e:
                attempt += 1
                if e.code() not in RETRYABLE or attempt > self.options.max_retries:
                    raise
                await self._wait(attempt, "Embed", e, give_up=False)

    async def _wait(self, attempt: int, what: str, error: grpc.aio.AioRpcError, give_up: bool = True) -> None:
        if give_up and attempt > self.options.max_retries:
            raise BatchFailed(f"{what}: {error.code().name} {attempt} times in a row: {error.details()}") from error
        delay = backoff_seconds(attempt, self.options.backoff_base, self.options.backoff_max)
        log.warning("%s: %s (%s); retry %d in %.1fs", what, error.code().name, error.details(), attempt, delay)
        await asyncio.sleep(delay)
