"""How generated tokens reach the caller: chunks joined into fewer messages, nothing lost or reordered.

The scheduler posts chunks to a sequence's outbox; a stream takes everything posted while it was
writing as one message, and with `stream_interval_ms` also what was generated during its pause.
Unary Generate (and HTTP's non-streamed completion) waits for the end once.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from client import generate_request
from service.generation.decoding import SamplingParams
from service.generation.handle import GenerationHandle
from service.generation.model import GenerationModel
from service.proto import inference_pb2 as pb
from tests.fixtures.server import generate_stream
from tests.service.generation.test_engine import load, runtime  # noqa: F401 - the fixture


def assert_same_generation(chunks: list[pb.GenerateChunk], unary: pb.GenerateResponse) -> None:
    """The stream's messages joined are the unary response; only the last one ends it."""
    assert "".join(c.text for c in chunks) == unary.text
    assert [t for c in chunks for t in c.token_ids] == list(unary.token_ids)
    assert all(c.finish_reason == pb.FINISH_REASON_UNSPECIFIED and not c.HasField("usage") for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == unary.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert last.usage.output_tokens == len(unary.token_ids) == unary.usage.output_tokens
    assert last.usage.input_tokens == unary.usage.input_tokens > 0
    assert last.timings.total_ms >= last.timings.time_to_first_token_ms > 0


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.9, top_k=20, top_p=0.95, seed=3)])
async def test_stream_interval_joins_tokens_and_loses_none(server, params):
    unary = await server.generation.Generate(generate_request("Once upon a time", max_new_tokens=48, **params))
    assert len(unary.token_ids) > 8
    every = await generate_stream(server, "Once upon a time", max_new_tokens=48, **params)
    joined = await generate_stream(server, "Once upon a time", max_new_tokens=48, stream_interval_ms=1000, **params)
    assert_same_generation(every, unary)
    assert_same_generation(joined, unary)
    assert len(joined[0].token_ids) >= 1  # the first message is not held back
    assert len(joined) < len(unary.token_ids)  # a message carries every token of its interval


async def test_stream_interval_out_of_range_is_invalid_argument(server):
    for call in (server.generation.Generate, lambda r: stream_all(server, r)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(generate_request("Hi", stream_interval_ms=1001))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "stream_interval_ms must be at most 1000" in err.value.details()


async def stream_all(server, request: pb.GenerateRequest) -> list[pb.GenerateChunk]:
    return [c async for c in server.generation.GenerateStream(request)]


async def test_a_lagging_reader_gets_every_chunk_in_order(runtime, tiny_models_root):  # noqa: F811
    """A reader that takes one chunk per generation step, or none until the end, or everything at once:
    the same tokens and text, the finish reason on the last chunk only."""
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    params = SamplingParams(max_new_tokens=40, temperature=0.8, seed=11)
    one_by_one = [c async for c in model.submit("Tom and Sue", params)]
    late = model.submit("Tom and Sue", params)
    while not late.sequence.done:  # the reader falls behind: every chunk is posted before it reads
        await asyncio.sleep(0.005)
    first = await late.__anext__()
    lagged = [first, *late.ready()]
    collected = await model.submit("Tom and Sue", params).collect()
    for chunks in (lagged, collected):
        assert [t for c in chunks for t in c.token_ids] == [t for c in one_by_one for t in c.token_ids]
        assert "".join(c.text for c in chunks) == "".join(c.text for c in one_by_one)
        assert [c.finish_reason is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    await model.stop()


async def test_collect_is_woken_once_at_the_end(runtime, tiny_models_root, monkeypatch):  # noqa: F811
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    waits = []
    real = GenerationHandle._wait

    async def counted(self):
        waits.append(len(self.sequence.generated))
        await real(self)

    monkeypatch.setattr(GenerationHandle, "_wait", counted)
    handle = model.submit("Once upon a time", SamplingParams(max_new_tokens=40))
    chunks = await handle.collect()
    assert sum(len(c.token_ids) for c in chunks) == len(handle.sequence.generated) > 1
    assert len(waits) <= 1  # not one wake-up per decode step
    streamed = model.submit("Once upon a time", SamplingParams(max_new_tokens=40))
    assert [t async for c in streamed for t in c.token_ids] == handle.sequence.generated
    await model.stop()
