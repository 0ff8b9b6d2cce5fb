"""Server CPU per generated token under concurrent GenerateStream calls (a real `python -m service`).

Starts the service (bench.common.ServiceProcess) over `--models`, warms it, then runs `--rounds`
rounds of `--streams` concurrent streams, each making `--calls` GenerateStream calls of
`--new-tokens` greedy tokens one after the other (a grpc.aio client in this process), reading the
server's user + system CPU time from /proc around each round. Prints JSON: median server CPU per
generated token (and the share of its main thread, the event loop), tokens/s and messages per call.

    python -m bench.generate_stream_cpu --models DIR [--model NAME] [--streams 64] [--calls 1] [--new-tokens 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import grpc

from bench.common import ServiceProcess
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

PROMPTS = ["Once upon a time", "The cat sat on", "Tom and Sue went to the", "Hi"]


def _cpu_seconds(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _cpu(pid: int) -> tuple[float, float]:
    """(whole process, its main thread: the event loop) CPU seconds so far."""
    return _cpu_seconds(Path(f"/proc/{pid}/stat")), _cpu_seconds(Path(f"/proc/{pid}/task/{pid}/stat"))


async def _stream(stub, prompt: str, model: str, new_tokens: int, calls: int = 1) -> tuple[int, int]:
    """`calls` GenerateStream calls one after the other -> (tokens, messages) received."""
    tokens = messages = 0
    request = pb.GenerateRequest(prompt=prompt, model=model, max_new_tokens=new_tokens)
    for _ in range(calls):
        async for chunk in stub.GenerateStream(request):
            tokens += len(chunk.token_ids)
            messages += 1
    return tokens, messages


async def _round(address: str, pid: int, args) -> dict[str, float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        await _stream(stub, "Hello", args.model, 4)
        (cpu, loop_cpu), wall = _cpu(pid), time.perf_counter()
        results = await asyncio.gather(
            *(
                _stream(stub, PROMPTS[i % len(PROMPTS)], args.model, args.new_tokens, args.calls)
                for i in range(args.streams)
            )
        )
        wall, (cpu_end, loop_end) = time.perf_counter() - wall, _cpu(pid)
    tokens = sum(t for t, _ in results)
    return {
        "server_cpu_us_per_token": (cpu_end - cpu) / tokens * 1e6,
        "event_loop_cpu_us_per_token": (loop_end - loop_cpu) / tokens * 1e6,
        "tokens_per_s": tokens / wall,
        "messages_per_call": sum(m for _, m in results) / (len(results) * args.calls),
        "tokens": tokens,
    }


async def measure(address: str, pid: int, args) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), 120)
    rounds = [await _round(address, pid, args) for _ in range(args.rounds)]
    out = {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]}
    spread = [
        round(min(r["server_cpu_us_per_token"] for r in rounds), 2),
        round(max(r["server_cpu_us_per_token"] for r in rounds), 2),
    ]
    return {
        **out,
        "range_cpu_us_per_token": spread,
        "streams": args.streams,
        "calls": args.calls,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--model", default="", help="generation model name (empty: the default)")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--max-batch", type=int, default=64, help="the server's --gen-max-batch")
    ap.add_argument("--calls", type=int, default=1, help="calls each stream makes one after the other per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    server = ServiceProcess(args.models, ["--gen-max-batch", str(args.max_batch)], http=False)
    try:
        print(json.dumps(asyncio.run(measure(server.address, server.proc.pid, args))))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
