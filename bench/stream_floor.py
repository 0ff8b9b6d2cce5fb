"""What grpcio alone costs a call: bare handlers, no model, the floor under the service's CPU.

Streams: a server subprocess whose GenerateStream yields `max_new_tokens` prebuilt one-token
chunks (no scheduler, no model, no metrics); 64 concurrent calls per round from a grpc.aio client
in this process; the server's user + system CPU (/proc) per call for 1, 5, 10, 20 and 40 messages
per call. The difference between them is the cost of a message, the intercept the cost of a call:
the floor under the service's CPU per generated token (docs/design/serving-overhead.md).

Unary (`--unary`): a bare Embed handler returning a prebuilt response, 32 calls in flight, served
once by grpc.aio and once by grpcio's thread-pool server (`grpc.server`): the floor under the
service's CPU per Embed call, whichever of grpcio's two Python servers it were built on.

    python -m bench.stream_floor [--rounds 20] [--unary]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from concurrent import futures

import grpc

from bench.overhead import cpu_seconds
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

MESSAGES = (1, 5, 10, 20, 40)
UNARY_SERVERS = ("aio", "threads")
UNARY_IN_FLIGHT = 32


class BareGeneration(pb_grpc.GenerationServiceServicer):
    async def GenerateStream(self, request, context):
        for _ in range(request.max_new_tokens - 1):
            yield pb.GenerateChunk(text=" word", token_ids=[42], model="bare")
        yield pb.GenerateChunk(text=" end", token_ids=[43], model="bare", finish_reason=pb.FINISH_REASON_LENGTH)


EMBED_RESPONSE = pb.EmbedResponse(model="bare")


class BareEmbedAio(pb_grpc.EmbeddingServiceServicer):
    async def Embed(self, request, context):
        return EMBED_RESPONSE


class BareEmbedThreads(pb_grpc.EmbeddingServiceServicer):
    def Embed(self, request, context):
        return EMBED_RESPONSE


async def serve_aio(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_GenerationServiceServicer_to_server(BareGeneration(), server)
    pb_grpc.add_EmbeddingServiceServicer_to_server(BareEmbedAio(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def serve_threads(port: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_EmbeddingServiceServicer_to_server(BareEmbedThreads(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


async def stream_calls(address: str, messages: int, streams: int, rounds: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)

        async def one() -> None:
            async for _ in stub.GenerateStream(pb.GenerateRequest(prompt="x", max_new_tokens=messages)):
                pass

        await one()
        start = time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(one() for _ in range(streams)))
        return time.perf_counter() - start


async def unary_calls(address: str, calls: int, in_flight: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        request = pb.EmbedRequest(inputs=["hello"])
        await stub.Embed(request)

        async def caller() -> None:
            for _ in range(calls // in_flight):
                await stub.Embed(request)

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        return time.perf_counter() - start


def start_server(kind: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "bench.stream_floor", "--serve", kind, "--port", str(port)])
    time.sleep(2)
    return server, f"127.0.0.1:{port}"


def measure_streams(rounds: int) -> list[dict]:
    server, address = start_server("aio")
    try:
        out = []
        for messages in MESSAGES:
            before = cpu_seconds(server.pid)
            wall = asyncio.run(stream_calls(address, messages, 64, rounds))
            n = 64 * rounds
            out.append(
                {
                    "messages_per_call": messages,
                    "server_cpu_us_per_call": round((cpu_seconds(server.pid) - before) / n * 1e6, 1),
                    "calls_per_s": round(n / wall, 1),
                }
            )
        return out
    finally:
        server.terminate()
        server.wait(30)


def measure_unary(rounds: int) -> list[dict]:
    out = []
    for kind in UNARY_SERVERS:
        server, address = start_server(kind)
        try:
            n = UNARY_IN_FLIGHT * 10 * rounds
            before = cpu_seconds(server.pid)
            wall = asyncio.run(unary_calls(address, n, UNARY_IN_FLIGHT))
            out.append(
                {
                    "server": kind,
                    "in_flight": UNARY_IN_FLIGHT,
                    "server_cpu_us_per_call": round((cpu_seconds(server.pid) - before) / n * 1e6, 1),
                    "calls_per_s": round(n / wall, 1),
                }
            )
        finally:
            server.terminate()
            server.wait(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds per measurement (64 streams; 320 unary calls)")
    ap.add_argument("--unary", action="store_true", help="unary Embed floor of grpc.aio and the thread-pool server")
    ap.add_argument("--serve", choices=UNARY_SERVERS, help=argparse.SUPPRESS)  # the server subprocess
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve == "aio":
        asyncio.run(serve_aio(args.port))
    elif args.serve == "threads":
        serve_threads(args.port)
    else:
        print(json.dumps(measure_unary(args.rounds) if args.unary else measure_streams(args.rounds)))


if __name__ == "__main__":
    main()
