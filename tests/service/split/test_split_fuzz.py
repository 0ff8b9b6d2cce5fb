"""The property test of tests/service/test_service_fuzz.py across the boundary: random requests for
every RPC against `--frontends 2` end with a documented status (never INTERNAL), and the group
still serves after the run."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.fuzzgen import Client, rpcs
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.service.split.conftest import SplitGroup, stop
from tests.service.test_service_fuzz import run_property, served_names


async def test_fuzzed_requests_across_the_boundary(all_kinds_root, chat_template_file):
    group = SplitGroup(all_kinds_root, 2, "--chat-template", f"tiny-gpt={chat_template_file}")
    try:
        async with grpc.aio.insecure_channel(group.address) as channel:
            client, seen = Client(group.address), Counter()
            try:
                names = await served_names(channel)
                await asyncio.to_thread(run_property, names, client, asyncio.get_running_loop(), seen)
            finally:
                await client.close()
            assert {rpc for rpc, code in seen if code == "OK"} == {r.name for r in rpcs()}, seen
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            response = await pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(inputs=["still here"]))
            assert len(response.embeddings) == 1
    finally:
        stop(group)
    assert not group.find(r"ERROR \[engine pid \d+\] service.split.engine"), "the engine logged a failed call"
