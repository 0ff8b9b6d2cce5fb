"""Long fuzzing runs: 10,000+ random requests over every RPC, concurrent, against a real server.

    python -m bench.fuzz --models models --requests 10000 --concurrency 16
    python -m bench.fuzz --address 127.0.0.1:50051 --requests 50000

Uses the request generator of the property test (bench/fuzzgen.py: built from the proto
descriptors, so every RPC and field is covered), the same number of requests per RPC, drawn in
chunks from a seed (`--seed`; reruns draw the same requests) while the previous chunk is in
flight. Without `--address` it starts `python -m service` on `--models` (and reports the server's
CPU time). Prints a table of status codes per RPC, each INTERNAL / UNKNOWN / DEADLINE_EXCEEDED
call (a bug, or a hang past `--timeout`) with its request, and a JSON summary as the last line.
Exits 1 when there was any such call or the server is not healthy and serving afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import ServiceProcess, conditions
from bench.fuzzgen import Client, Rpc, calls, draw, rpcs
from bench.procstat import cpu_seconds
from service.errors import quote
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger("bench.fuzz")
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}


def describe(message, limit: int = 48) -> str:
    """A request in one line, long strings and lists cut short (a failure report, not a dump)."""
    parts = []
    for field, value in message.ListFields():
        items = list(value) if field.is_repeated else [value]
        shown = [
            quote(v, limit) if isinstance(v, str) else describe(v) if hasattr(v, "ListFields") else repr(v)
            for v in items[:4]
        ]
        more = f", … {len(items)} items" if len(items) > 4 else ""
        parts.append(f"{field.name}=" + (f"[{', '.join(shown)}{more}]" if field.is_repeated else shown[0]))
    return f"{message.DESCRIPTOR.name}({', '.join(parts)})"


def mixed_chunk(known: list[str], size: int, seed: int) -> list[tuple[Rpc, object]]:
    """size requests, the same number for every RPC, in a seeded random order."""
    methods = rpcs()
    chunk = [
        c
        for i, rpc in enumerate(methods)
        for c in draw(calls(known, only=[rpc]), -(-size // len(methods)), seed * 1000 + i)
    ]
    random.Random(seed).shuffle(chunk)
    return chunk


async def fuzz(client: Client, known: list[str], args: argparse.Namespace) -> tuple[Counter, list[dict]]:
    """Sends args.requests calls, args.concurrency at a time -> (counts by (rpc, code), bad calls)."""
    counts: Counter[tuple[str, str]] = Counter()
    bad: list[dict] = []
    gate = asyncio.Semaphore(args.concurrency)

    async def one(rpc: Rpc, payload) -> None:
        async with gate:
            code, details = await client.invoke(rpc, payload, args.timeout)
        counts[rpc.name, code.name] += 1
        if code in BAD:
            request = " + ".join(describe(p) for p in payload) if rpc.client_streaming else describe(payload)
            bad.append({"rpc": rpc.name, "code": code.name, "details": details[:300], "request": request})
            log.error("%s %s: %s\n  request: %s", rpc.name, code.name, details[:300], request)

    k, upcoming = 0, asyncio.create_task(asyncio.to_thread(mixed_chunk, known, args.chunk, args.seed))
    while (left := args.requests - sum(counts.values())) > 0:  # a chunk can be short (few distinct requests)
        batch = (await upcoming)[:left]
        k += 1
        if left > len(batch):  # draw the next chunk while this one is in flight
            upcoming = asyncio.create_task(asyncio.to_thread(mixed_chunk, known, args.chunk, args.seed + k))
        await asyncio.gather(*(one(rpc, payload) for rpc, payload in batch))
        log.info("chunk %d done: %d of %d calls", k, sum(counts.values()), args.requests)
    return counts, bad


def table(counts: Counter) -> str:
    """Markdown table: one row per RPC, one column per status code seen."""
    codes = sorted({code for _, code in counts}, key=lambda c: grpc.StatusCode[c].value[0])
    names = [r.name for r in rpcs()]
    lines = ["| RPC | " + " | ".join(codes) + " | total |", "|---" * (len(codes) + 2) + "|"]
    for name in names:
        row = [counts.get((name, c), 0) for c in codes]
        lines.append(f"| {name} | " + " | ".join(str(v) for v in row) + f" | {sum(row)} |")
    totals = [sum(v for (_, c), v in counts.items() if c == code) for code in codes]
    lines.append("| all | " + " | ".join(str(v) for v in totals) + f" | {sum(totals)} |")
    return "\n".join(lines)


async def alive(client: Client) -> bool:
    """Health says SERVING and a normal call of each kind succeeds."""
    health = await health_pb2_grpc.HealthStub(client.aio).Check(health_pb2.HealthCheckRequest(), timeout=30)
    listed = await pb_grpc.ModelServiceStub(client.aio).ListModels(pb.ListModelsRequest(), timeout=30)
    kinds = {m.kind for m in listed.models}
    if "embedding" in kinds:
        await pb_grpc.EmbeddingServiceStub(client.aio).Embed(pb.EmbedRequest(inputs=["fine"]), timeout=30)
    if "generation" in kinds:
        await pb_grpc.GenerationServiceStub(client.aio).Generate(
            pb.GenerateRequest(prompt="Once", max_new_tokens=4), timeout=30
        )
    return health.status == health_pb2.HealthCheckResponse.SERVING


async def session(address: str, args: argparse.Namespace, pid: int | None) -> dict:
    client = Client(address)
    try:
        listed = await pb_grpc.ModelServiceStub(client.aio).ListModels(pb.ListModelsRequest(), timeout=30)
        known = [m.name for m in listed.models]
        cpu0, start = cpu_seconds(pid) if pid else 0.0, time.perf_counter()
        counts, bad = await fuzz(client, known, args)
        wall = time.perf_counter() - start
        live = await alive(client)
    finally:
        await client.close()
    return {
        "requests": sum(counts.values()),
        "wall_s": round(wall, 1),
        "server_cpu_s": round(cpu_seconds(pid) - cpu0, 1) if pid else None,
        "counts": {f"{r} {c}": v for (r, c), v in sorted(counts.items())},
        "bad": bad,
        "alive_after": live,
        "table": table(counts),
        "models": known,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="models", help="model root for the server it starts")
    parser.add_argument("--address", help="fuzz this server instead of starting one")
    parser.add_argument("--server-pid", type=int, help="with --address: the server's pid, to report its CPU time")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=700, help="requests drawn at a time")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-call deadline: past it, a hang")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    server = None if args.address else ServiceProcess(Path(args.models), [], metrics=False)
    address, pid = (server.address, server.proc.pid) if server else (args.address, args.server_pid)
    try:
        result = asyncio.run(session(address, args, pid))
    finally:
        if server:
            server.stop()
    sys.stdout.write(result.pop("table") + "\n")
    sys.stdout.write(json.dumps({**result, "conditions": conditions()}) + "\n")
    return 1 if result["bad"] or not result["alive_after"] else 0


if __name__ == "__main__":
    sys.exit(main())
