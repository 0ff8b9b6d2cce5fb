"""The embedding batcher under a blocked executor: dropped work, a full queue, expired deadlines.

The compute executor (one worker) is blocked deterministically by a job that waits on a
threading.Event, so a call's batch is formed but cannot run; the tests then cancel / overflow /
expire calls and release the executor. Progress is observed through the public metrics, polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import grpc
import pytest

from client import embed_request
from service.grpc.embedding import STREAM_WINDOW
from tests.fixtures.server import metric, until

MODEL = {"model": "tiny-embed"}


class BlockedExecutor:
    """Occupies the runtime's only compute worker until released."""

    def __init__(self, runtime):
        self.release_event, self.started = threading.Event(), threading.Event()
        self.job = asyncio.ensure_future(runtime.run(self._block))

    def _block(self) -> None:
        self.started.set()
        self.release_event.wait(30)

    async def __aenter__(self) -> BlockedExecutor:
        await asyncio.to_thread(self.started.wait, 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release_event.set()
        await self.job


@contextlib.asynccontextmanager
async def queued_behind_block(srv, waiting_inputs: int):
    """The one compute worker blocked, one call in its formed batch and `waiting_inputs` inputs
    queued behind it; yields those two calls, which finish once the block lifts (after the with)."""
    queued = metric("ts_queue_duration_seconds_count", MODEL)
    async with BlockedExecutor(srv.server.runtime):
        first = srv.embedding.Embed(embed_request(["in the formed batch"]))
        await until(lambda: metric("ts_queue_duration_seconds_count", MODEL) == queued + 1)  # the one slot is taken
        waiting = srv.embedding.Embed(embed_request([f"input {i}" for i in range(waiting_inputs)]))
        await until(lambda: metric("ts_queue_depth", MODEL) == waiting_inputs)
        yield first, waiting


@pytest.fixture
async def srv(start_server, embed_models_root):
    return await start_server(
        embed_models_root, compute_workers=1, embed_max_wait_ms=0.0, embed_max_queue=4, embed_max_inputs=4
    )


async def test_cancelled_call_is_dropped_before_compute(srv):
    batches = metric("ts_batch_size_count", MODEL)
    tokens = metric("ts_tokens_total", {**MODEL, "direction": "input"})
    dropped = metric("ts_dropped_items_total", {**MODEL, "reason": "cancelled"})
    queued = metric("ts_queue_duration_seconds_count", MODEL)
    cancelled = metric(
        "ts_requests_total",
        {"service": "EmbeddingService", "method": "Embed", "code": "CANCELLED", "protocol": "grpc", **MODEL},
    )
    async with BlockedExecutor(srv.server.runtime):
        call = srv.embedding.Embed(embed_request(["never computed"]))
        await until(lambda: metric("ts_queue_duration_seconds_count", MODEL) == queued + 1)  # batch formed
        call.cancel()
        await until(
            lambda: (
                metric(
                    "ts_requests_total",
                    {
                        "service": "EmbeddingService",
                        "method": "Embed",
                        "code": "CANCELLED",
                        "protocol": "grpc",
                        **MODEL,
                    },
                )
                == cancelled + 1
            )
        )
    await until(lambda: metric("ts_dropped_items_total", {**MODEL, "reason": "cancelled"}) == dropped + 1)
    assert metric("ts_batch_size_count", MODEL) == batches
    assert metric("ts_tokens_total", {**MODEL, "direction": "input"}) == tokens
    response = await srv.embedding.Embed(embed_request(["still serving"]))
    assert len(response.embeddings) == 1


async def test_full_queue_is_resource_exhausted_at_once(srv):
    async with queued_behind_block(srv, 3) as (first, waiting):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await srv.embedding.Embed(embed_request(["one", "too many"]))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "3 of 4 queued inputs" in err.value.details()
    assert len((await first).embeddings) == 1
    assert len((await waiting).embeddings) == 3
    assert metric("ts_queue_capacity", MODEL) == 4


async def test_expired_call_is_deadline_exceeded_and_dropped(srv):
    expired = metric("ts_dropped_items_total", {**MODEL, "reason": "expired"})
    async with BlockedExecutor(srv.server.runtime):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await srv.embedding.Embed(embed_request(["too late"]), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await until(lambda: metric("ts_dropped_items_total", {**MODEL, "reason": "expired"}) == expired + 1)


def embed_tasks() -> list[asyncio.Task]:
    """The EmbedStream's per-request tasks on this (the server's) event loop that have not ended."""
    return [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "EmbeddingServicer._embed"]


async def test_embed_stream_cancelled_with_a_full_window_leaves_no_task(start_server, embed_models_root):
    """The client leaves while the stream's window is full and one more request waits for a place:
    that request's task is cancelled with the rest, not left computing for nobody."""
    srv = await start_server(
        embed_models_root, compute_workers=1, embed_max_wait_ms=0.0, embed_max_queue=32, embed_max_inputs=8
    )
    count = STREAM_WINDOW + 2  # one being answered, a full window, one more waiting for a place
    batches = metric("ts_batch_size_count", MODEL)
    dropped = metric("ts_dropped_items_total", {**MODEL, "reason": "cancelled"})
    async with BlockedExecutor(srv.server.runtime):
        left = asyncio.Event()

        async def requests():
            for i in range(count):
                yield embed_request([f"stream {i}"])
            await left.wait()  # the stream stays open until the client leaves

        call = srv.embedding.EmbedStream(requests())
        await until(lambda: len(embed_tasks()) == count, what="every request read")
        call.cancel()
        left.set()
        await until(lambda: not embed_tasks(), timeout=10, what="every request's task ended")
    await until(lambda: metric("ts_dropped_items_total", {**MODEL, "reason": "cancelled"}) == dropped + count)
    assert metric("ts_batch_size_count", MODEL) == batches  # none of them computed
    response = await srv.embedding.Embed(embed_request(["still serving"]))
    assert len(response.embeddings) == 1
