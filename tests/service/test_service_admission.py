"""Admission before work: a call is refused (RESOURCE_EXHAUSTED) from what it carries, before tokenization.

Real servers over the tiny models. The queue is filled for real (the one compute worker blocked,
tests/service/embedding/test_service_batching.py); the model's tokenizer is then swapped for one that raises, so a
call that reached tokenization would fail with INTERNAL instead of RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import grpc
import pytest

from client import embed_request
from service.errors import InvalidArgument, ResourceExhausted
from service.generation.decoding import SamplingParams
from tests.service.embedding.test_service_batching import queued_behind_block


class Exploding:
    """A tokenizer stand-in whose every use fails loudly."""

    def __init__(self, error: Exception):
        self.error, self.calls = error, 0

    def encode(self, *args, **kwargs):
        self.calls += 1
        raise self.error

    async def encode_async(self, *args, **kwargs):  # the embedding tokenizer's, from the event loop
        return self.encode(*args, **kwargs)


@pytest.fixture
async def srv(start_server, embed_models_root):
    return await start_server(
        embed_models_root, compute_workers=1, embed_max_wait_ms=0.0, embed_max_queue=4, embed_max_inputs=4
    )


async def test_full_queue_refuses_before_tokenizing(srv, monkeypatch):
    model = srv.server.registry.get("embedding")
    async with queued_behind_block(srv, 4) as (first, waiting):
        exploding = Exploding(RuntimeError("tokenized a call that should have been refused"))
        monkeypatch.setattr(model.tokenizer, "encode_async", exploding.encode_async)
        for inputs in (["short"], ["long " * 4000]):  # inline and thread tokenization paths
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await srv.embedding.Embed(embed_request(inputs))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "4 of 4 queued inputs" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [r async for r in srv.embedding.EmbedStream(iter([embed_request(["streamed"])]))]
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert exploding.calls == 0
        monkeypatch.undo()
    assert len((await first).embeddings) == 1
    assert len((await waiting).embeddings) == 4


async def test_failed_tokenization_gives_its_places_back(srv, monkeypatch):
    model = srv.server.registry.get("embedding")
    exploding = Exploding(InvalidArgument("refused by the tokenizer"))
    monkeypatch.setattr(model.tokenizer, "encode_async", exploding.encode_async)
    for _ in range(3):  # each call reserves the whole queue; a leaked reservation would refuse the next
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await srv.embedding.Embed(embed_request(["a", "b", "c", "d"]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exploding.calls == 3
    monkeypatch.undo()
    assert len((await srv.embedding.Embed(embed_request(["a", "b", "c", "d"]))).embeddings) == 4


async def test_generation_queue_full_refuses_before_tokenizing(start_server, monkeypatch):
    srv = await start_server(gen_max_queue=2)
    model = srv.server.registry.get("generation")
    # No await between these submits: the scheduler task cannot admit them, so the queue is full.
    handles = [model.submit("Once upon a time", SamplingParams(max_new_tokens=4)) for _ in range(2)]
    exploding = Exploding(RuntimeError("tokenized a call that should have been refused"))
    monkeypatch.setattr(model, "tokenizer", exploding)
    with pytest.raises(ResourceExhausted, match="2 waiting"):
        model.submit("Once upon a time", SamplingParams(max_new_tokens=4))
    assert exploding.calls == 0
    monkeypatch.undo()
    for handle in handles:
        assert [chunk async for chunk in handle][-1].finish_reason is not None
