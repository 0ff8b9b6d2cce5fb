"""One process vs `--frontends N` (front ends before an engine core), side by side: CPU per call and
per generated token, of the engine process and of the whole server, and the streams' scaling.

For each configuration, in alternating rounds, starts `python -m service` over `--models` (tiny
models: `python -m export tiny --out DIR`) and measures, after a warm-up pass:
- `--embed-calls` one-input Embed calls from `--embed-clients` concurrent clients (a connection each);
- `--streams` concurrent GenerateStream calls of `--new-tokens` greedy tokens (own connections);
- tokens/s of 8 concurrent streams and of 1 (the ratio says how decoding batches across streams).
CPU comes from /proc (user + system): the whole server is the supervisor's process tree; the engine
is the engine core process (the one process without `--frontends`); `ts_engine_cpu_seconds_total`
is read beside it. Prints JSON with the CPU model and the load average before and after.

    python -m bench.engine_core --models DIR [--frontends 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench.common import ServiceProcess, conditions, summary
from bench.procstat import TICKS, _stat, cpu_seconds
from client import embed_request, generate_request
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger("bench.engine_core")
PROMPTS = ["Once upon a time", "The cat sat on", "Tom and Sue went to the", "Hi"]


def own_cpu(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS


def engine_metric(url: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "ts_engine_cpu_seconds_total"
    )


def channels(address: str, n: int) -> list[grpc.aio.Channel]:
    return [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(n)]


async def embed(address: str, calls: int, clients: int) -> int:
    pending = list(range(calls))
    chans = channels(address, clients)

    async def client(channel: grpc.aio.Channel) -> None:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        while pending:
            await stub.Embed(embed_request([f"sentence number {pending.pop()}"]), timeout=60)

    try:
        await asyncio.gather(*(client(c) for c in chans))
    finally:
        await asyncio.gather(*(c.close() for c in chans))
    return calls


async def stream(address: str, streams: int, new_tokens: int) -> int:
    """`streams` concurrent GenerateStream calls, each on its own connection; tokens received."""
    chans = channels(address, streams)

    async def one(i: int, channel: grpc.aio.Channel) -> int:
        request = generate_request(PROMPTS[i % len(PROMPTS)], max_new_tokens=new_tokens)
        return sum([len(c.token_ids) async for c in pb_grpc.GenerationServiceStub(channel).GenerateStream(request)])

    try:
        return sum(await asyncio.gather(*(one(i, c) for i, c in enumerate(chans))))
    finally:
        await asyncio.gather(*(c.close() for c in chans))


def timed(server: ServiceProcess, engine: int, work) -> dict:
    """Runs `work` (a coroutine returning its count) -> wall s, count, server / engine CPU s."""
    whole, mine = cpu_seconds(server.proc.pid), own_cpu(engine)
    metric = engine_metric(server.metrics_url) if engine != server.proc.pid else 0.0
    start = time.perf_counter()
    count = asyncio.run(work)
    wall = time.perf_counter() - start
    time.sleep(1.1)  # the engine's metric is sampled once a second
    metric = engine_metric(server.metrics_url) - metric if engine != server.proc.pid else 0.0
    return {
        "wall": wall,
        "count": count,
        "server": cpu_seconds(server.proc.pid) - whole,
        "engine": own_cpu(engine) - mine,
        "metric": metric,
    }


def measure(models: Path, frontends: int, args) -> dict:
    flags = ["--gen-max-batch", "64"] + (["--frontends", str(frontends)] if frontends else [])
    server = ServiceProcess(models, flags, http=False, metrics=True)
    try:
        ready = [m for line in server.log if (m := re.search(r"worker 0 ready \(pid (\d+)\)", line))]
        engine = int(ready[-1][1]) if frontends else server.proc.pid
        asyncio.run(embed(server.address, args.embed_clients * 4, args.embed_clients))  # warm-up
        asyncio.run(stream(server.address, 4, 8))
        e = timed(server, engine, embed(server.address, args.embed_calls, args.embed_clients))
        g = timed(server, engine, stream(server.address, args.streams, args.new_tokens))
        eight = timed(server, engine, stream(server.address, 8, args.new_tokens))
        one = timed(server, engine, stream(server.address, 1, args.new_tokens))
    finally:
        exit_code = server.stop()
    return {
        "embed_server_cpu_us_per_call": e["server"] / e["count"] * 1e6,
        "embed_engine_cpu_us_per_call": e["engine"] / e["count"] * 1e6,
        "embed_engine_metric_us_per_call": e["metric"] / e["count"] * 1e6,
        "embed_calls_per_s": e["count"] / e["wall"],
        "gen_server_cpu_us_per_token": g["server"] / g["count"] * 1e6,
        "gen_engine_cpu_us_per_token": g["engine"] / g["count"] * 1e6,
        "gen_engine_metric_us_per_token": g["metric"] / g["count"] * 1e6,
        "gen_tokens_per_s": g["count"] / g["wall"],
        "streams_8_vs_1_tokens_per_s": (eight["count"] / eight["wall"]) / (one["count"] / one["wall"]),
        "exit_code": exit_code,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine_core", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, required=True, help="models root (tiny: python -m export tiny --out DIR)")
    p.add_argument("--frontends", type=int, default=2)
    p.add_argument("--embed-calls", type=int, default=2000)
    p.add_argument("--embed-clients", type=int, default=32)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    names = {"one process": 0, f"--frontends {args.frontends}": args.frontends}
    runs: dict[str, list[dict]] = {name: [] for name in names}
    before = conditions()
    for r in range(args.rounds):
        for name, frontends in names.items():
            runs[name].append(measure(args.models, frontends, args))
            log.info("round %d %s: %s", r, name, runs[name][-1])
    result = {
        "conditions_before": before,
        "conditions_after": conditions(),
        "embed_calls": args.embed_calls,
        "embed_clients": args.embed_clients,
        "streams": args.streams,
        "new_tokens": args.new_tokens,
        "configs": {name: {k: summary([run[k] for run in rs]) for k in rs[0]} for name, rs in runs.items()},
    }
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
