"""`--frontends 2` when things go away: a cancelled stream frees its row in the engine; a front end
killed with SIGKILL mid-stream frees every row it held; a killed engine core makes the front ends
answer UNAVAILABLE at once (no hang), is restarted by the supervisor, and the group serves again;
SIGTERM with 32 streams in flight lets every one finish and exits 0; embedding calls that expire or
are refused across the boundary leave the engine's queue empty."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import embed_request, generate_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.fixtures.server import until
from tests.service.split.conftest import SplitGroup, stop

LONG = 150  # tokens a stream asks for: with one row at a time, the later streams wait their turn
HOLD = json.dumps({"regex": "[a-z ]{140}"})  # no early end of text: each row lives for many steps
STREAMS = 16


def long_request(prompt: str) -> pb.GenerateRequest:
    request = generate_request(prompt, max_new_tokens=LONG)
    request.structured_outputs_json = HOLD
    return request


def in_flight(group: SplitGroup) -> float:
    return group.metrics().get(("ts_generations_in_flight", (("model", "tiny-gpt"),)), 0.0)


def dropped(group: SplitGroup) -> float:
    return group.metrics().get(("ts_dropped_items_total", (("model", "tiny-gpt"), ("reason", "cancelled"))), 0.0)


def channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


@pytest.fixture
def one_row(tiny_models_root):
    group = SplitGroup(tiny_models_root, 2, "--gen-max-batch", "1")
    yield group
    stop(group)


async def test_a_cancelled_stream_frees_its_row(one_row):
    group = one_row
    before = dropped(group)
    async with channel(group.address) as ch:
        stub = pb_grpc.GenerationServiceStub(ch)
        calls = [stub.GenerateStream(long_request(f"story {i}")) for i in range(STREAMS)]
        await until(lambda: in_flight(group) >= 4, what="generations admitted")  # one row: 3+ of them wait
        for call in calls:
            call.cancel()
        await until(lambda: dropped(group) > before, what="a waiting generation dropped uncomputed")
        await until(lambda: in_flight(group) == 0, what="every row freed")


def accepted(metrics: dict, frontend: int) -> float:
    return metrics.get(("ts_worker_rpcs_total", (("worker", str(frontend)),)), 0.0)


def _accepted(group: SplitGroup, before: dict) -> list[float]:
    now = group.metrics()
    return [accepted(now, i) - accepted(before, i) for i in (1, 2)]


async def _warm(group: SplitGroup) -> None:
    """One structured call answered by each front end: its structure compiled (front ends check it)."""
    before = group.metrics()
    for _ in range(64):
        async with channel(group.address) as c:
            request = long_request("warm")
            request.max_new_tokens = 1
            await pb_grpc.GenerationServiceStub(c).Generate(request, timeout=60)
        if min(_accepted(group, before)) > 0:
            return
    raise AssertionError("64 connections never reached both front ends")


async def test_embed_calls_past_their_deadline_leave_the_engine_queue_empty(one_row):
    """A burst of 16-input Embed calls with a short deadline: each one answers OK, DEADLINE_EXCEEDED
    or RESOURCE_EXHAUSTED (never another status, never a hang), the engine drops what expired in its
    queue, the queue's depth goes back to 0, and the next call is served."""
    group = one_row

    async def one(stub, i: int) -> grpc.StatusCode:
        try:
            await stub.Embed(embed_request([f"text {i} {j}" for j in range(16)]), timeout=0.1)
        except grpc.aio.AioRpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    async with channel(group.address) as ch:
        stub = pb_grpc.EmbeddingServiceStub(ch)
        codes = await asyncio.wait_for(asyncio.gather(*(one(stub, i) for i in range(200))), 60)
        allowed = {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert set(codes) <= allowed, codes
        depth = ("ts_queue_depth", (("model", "tiny-embed"),))
        await until(lambda: group.metrics().get(depth) == 0.0, what="the engine's embedding queue empties")
        answer = await stub.Embed(embed_request(["after the burst"]), timeout=30)
        assert len(answer.embeddings) == 1


async def test_a_killed_front_end_frees_its_rows(one_row):
    group = one_row
    await _warm(group)
    before = group.metrics()
    channels = [channel(group.address) for _ in range(STREAMS)]
    await asyncio.gather(*(c.channel_ready() for c in channels))  # connected first: the calls start at once
    calls = [
        pb_grpc.GenerationServiceStub(c).GenerateStream(long_request(f"story {i}")) for i, c in enumerate(channels)
    ]

    def victim_holds_streams() -> bool:
        # Every stream accepted, and more in flight than the front end with fewer holds: so the other
        # (the victim) holds some. tiny-gpt on one row ends a stream in ~25 ms: no fixed count is safe.
        per = _accepted(group, before)
        return sum(per) == STREAMS and in_flight(group) > min(per) + 2

    try:
        await until(victim_holds_streams, what="every stream accepted, the victim holding some")
        per_frontend = dict(zip((1, 2), _accepted(group, before), strict=True))
        victim = max(per_frontend, key=per_frontend.__getitem__)
        pid = group.pid(victim)
        os.kill(pid, signal.SIGKILL)
        group.wait_for(rf"front end pid {pid} exited; cancelling its \d+ call\(s\), [1-9]\d* generation\(s\)")
        ended = await asyncio.gather(*(_ending(c) for c in calls))
        assert 1 <= ended.count(grpc.StatusCode.UNAVAILABLE) <= per_frontend[victim], ended
        assert set(ended) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, ended
        await until(lambda: in_flight(group) == 0, what="every row freed")
        group.wait_for(rf"worker {victim} ready \(pid (?!{pid}\))\d+\)")  # restarted
    finally:
        for c in channels:
            await c.close()


async def _ending(call) -> grpc.StatusCode:
    try:
        while await call.read() != grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def test_a_killed_engine_answers_unavailable_at_once_then_serves_again(one_row):
    group = one_row
    engine = group.pid(0)
    async with channel(group.address) as ch:
        stub = pb_grpc.GenerationServiceStub(ch)
        calls = [stub.GenerateStream(long_request(f"tale {i}"), timeout=60) for i in range(4)]
        assert (await calls[0].read()).token_ids
        os.kill(engine, signal.SIGKILL)
        ended = await asyncio.gather(*(_ending(c) for c in calls))
        assert grpc.StatusCode.UNAVAILABLE in ended and set(ended) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK}
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # the engine is down: refused, not queued
            await pb_grpc.EmbeddingServiceStub(ch).Embed(pb.EmbedRequest(inputs=["x"]), timeout=60)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "engine core process is not running" in refused.value.details()
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60)
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING  # until the engine is back
        group.wait_for(rf"worker 0 ready \(pid (?!{engine}\))\d+\)")
        successor = group.pid(0)
        for frontend in (1, 2):  # each front end connects to the new engine
            group.wait_for(rf"\[front end {frontend} pid \d+\] service.split.client: engine core pid {successor}")
        assert _embeds(group.address)
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reply = await stub.Generate(generate_request("Once upon", max_new_tokens=4), timeout=60)
        assert reply.token_ids


def _embeds(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        return len(pb_grpc.EmbeddingServiceStub(ch).Embed(pb.EmbedRequest(inputs=["x"]), timeout=10).embeddings) == 1


async def test_sigterm_drains_32_streams_and_exits_0(tiny_models_root):
    group = SplitGroup(tiny_models_root, 2, "--grace-seconds", "60", "--gen-max-batch", "32")
    try:
        channels = [channel(group.address) for _ in range(4)]
        calls = [
            pb_grpc.GenerationServiceStub(channels[i % 4]).GenerateStream(long_request(f"tale {i}"), timeout=120)
            for i in range(32)
        ]
        firsts = [await call.read() for call in calls]  # every one admitted and decoding
        assert all(first.token_ids for first in firsts)
        group.proc.send_signal(signal.SIGTERM)
        ended = await asyncio.gather(*(_finished(c, f) for c, f in zip(calls, firsts, strict=True)))
        assert all(ended), "a stream in flight at SIGTERM did not finish"
        for c in channels:
            await c.close()
        assert await asyncio.to_thread(group.wait) == 0, "".join(group.log)
        assert group.find(r"service.split.engine: engine stopped")
    finally:
        group.kill()


async def _finished(call, first: pb.GenerateChunk) -> bool:
    """The stream, whose first message was read already, ends with a finish reason. That first
    message may be the last: a front end that was not scheduled while its engine decoded joins
    every token it finds into one message."""
    chunks = [first]
    while (chunk := await call.read()) != grpc.aio.EOF:
        chunks.append(chunk)
    return chunks[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
