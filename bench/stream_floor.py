"""What grpc.aio alone costs a streaming call: a bare GenerateStream handler, no model.

A server subprocess whose GenerateStream yields `max_new_tokens` prebuilt one-token chunks (no
scheduler, no model, no metrics); 64 concurrent calls per round from a grpc.aio client in this
process; the server's user + system CPU (/proc) per call for 1, 5, 10, 20 and 40 messages per
call. The difference between them is the cost of a message, the intercept the cost of a call:
the floor under the service's CPU per generated token (docs/design/serving-overhead.md).

    python -m bench.stream_floor [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import grpc

from bench.overhead import cpu_seconds
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

MESSAGES = (1, 5, 10, 20, 40)


class BareGeneration(pb_grpc.GenerationServiceServicer):
    async def GenerateStream(self, request, context):
        for _ in range(request.max_new_tokens - 1):
            yield pb.GenerateChunk(text=" word", token_ids=[42], model="bare")
        yield pb.GenerateChunk(text=" end", token_ids=[43], model="bare", finish_reason=pb.FINISH_REASON_LENGTH)


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_GenerationServiceServicer_to_server(BareGeneration(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def calls(address: str, messages: int, streams: int, rounds: int) -> float:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds of 64 concurrent calls per message count")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server subprocess: its port
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "bench.stream_floor", "--serve", str(port)])
    try:
        time.sleep(2)
        out = []
        for messages in MESSAGES:
            before = cpu_seconds(server.pid)
            wall = asyncio.run(calls(f"127.0.0.1:{port}", messages, 64, args.rounds))
            n = 64 * args.rounds
            out.append({"messages_per_call": messages, "server_cpu_us_per_call": round((cpu_seconds(server.pid) - before)
                                                                                      / n * 1e6, 1),
                        "calls_per_s": round(n / wall, 1)})
        print(json.dumps(out))
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
