"""`--frontends 2 --engines 2` (one engine core per device; here two on the CPU) when an engine goes
away: the streams it held fail UNAVAILABLE, the other engine's finish, new calls are served by the
survivor at once (health stays SERVING), and the restarted engine takes calls again; SIGTERM with
streams on both engines drains every one and exits 0. Every door's answers against one process:
test_split_parity.py (its `two-engines` cases)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client import generate_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.fixtures.server import until
from tests.service.split.conftest import SplitGroup, stop
from tests.service.split.test_split_lifecycle import STREAMS, _ending, _finished, channel, in_flight, long_request


@pytest.fixture
def two_engines(tiny_models_root):
    group = SplitGroup(tiny_models_root, 2, "--gen-max-batch", "1", engines=2)  # one row each: streams wait
    yield group
    stop(group)


async def _serving(ch: grpc.aio.Channel) -> int:
    return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60)).status


async def _served(ch: grpc.aio.Channel) -> None:
    """A generation and an embedding answered."""
    request = generate_request("Once upon", max_new_tokens=4)
    reply = await pb_grpc.GenerationServiceStub(ch).Generate(request, timeout=60)
    assert reply.token_ids
    embedded = await pb_grpc.EmbeddingServiceStub(ch).Embed(pb.EmbedRequest(inputs=["x"]), timeout=60)
    assert len(embedded.embeddings) == 1


async def test_a_killed_engine_fails_only_its_streams_while_the_other_serves(two_engines):
    group = two_engines
    victim = group.pid(0)
    os.kill(victim, signal.SIGSTOP)  # the calls it takes wait (a tiny-gpt stream ends in ~30 ms)
    try:
        async with channel(group.address) as ch:  # one connection: one front end spreads its calls
            stub = pb_grpc.GenerationServiceStub(ch)
            # a front end's first call goes to engine 0 (ties go in turn from it), the rest to the
            # engine with less waiting on it: the stopped victim holds a few, the survivor the others
            calls = [stub.GenerateStream(long_request(f"tale {i}"), timeout=120) for i in range(STREAMS)]
            ending = [asyncio.ensure_future(_ending(c)) for c in calls]
            await until(lambda: sum(e.done() for e in ending) >= STREAMS // 2, what="the survivor's streams done")
            os.kill(victim, signal.SIGKILL)
            ended = await asyncio.gather(*ending)
            # the victim's streams failed at once, the survivor's ran to their end
            assert set(ended) == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, ended
            assert await _serving(ch) == health_pb2.HealthCheckResponse.SERVING
            await _served(ch)  # by the survivor, whether or not the victim is back yet
            group.wait_for(rf"worker 0 ready \(pid (?!{victim}\))\d+\)")
            successor = group.pid(0)
            for frontend in group.frontends:  # each front end connects to the new engine
                group.wait_for(rf"\[front end {frontend} pid \d+\] service.split.client: engine core pid {successor}")
            survivor = group.pid(1)
            os.kill(survivor, signal.SIGKILL)  # now only the restarted engine can answer
            for frontend in group.frontends:  # a call sent before a front end saw the exit fails with it
                group.wait_for(rf"\[front end {frontend} pid \d+\] .*: engine core pid {survivor} exited")
            await _served(ch)
            assert await _serving(ch) == health_pb2.HealthCheckResponse.SERVING
        await until(lambda: in_flight(group) == 0, what="every row freed")
    finally:
        with contextlib.suppress(ProcessLookupError):  # the test failed before it killed the victim
            os.kill(victim, signal.SIGCONT)


async def test_sigterm_drains_streams_on_both_engines_and_exits_0(tiny_models_root):
    group = SplitGroup(tiny_models_root, 2, "--grace-seconds", "60", "--gen-max-batch", str(STREAMS), engines=2)
    try:
        async with channel(group.address) as ch:
            stub = pb_grpc.GenerationServiceStub(ch)
            calls = [stub.GenerateStream(long_request(f"tale {i}"), timeout=120) for i in range(2 * STREAMS)]
            firsts = [await call.read() for call in calls]  # every one admitted (half an engine) and decoding
            assert all(first.token_ids for first in firsts)
            group.proc.send_signal(signal.SIGTERM)
            ended = await asyncio.gather(*(_finished(c, f) for c, f in zip(calls, firsts, strict=True)))
        assert all(ended), "a stream in flight at SIGTERM did not finish"
        assert await asyncio.to_thread(group.wait) == 0, "".join(group.log)
        stopped = [line for line in group.log if "service.split.engine: engine stopped" in line]
        assert len(stopped) == 2, "".join(group.log)
    finally:
        group.kill()
