"""Embed throughput and server CPU with 1 vs N serving processes (`--workers`), side by side.

For each configuration `WORKERSxCOMPUTE` (workers x compute threads per worker, 1 intra-op
thread each), in alternating rounds: starts `python -m service` serving one embedding model,
sends `--calls` single-sentence Embed calls from `--clients` concurrent clients, each on its own
connection (the kernel spreads connections, not calls, over the workers), after a warm-up pass;
reports sentences/s (wall) and the server's CPU seconds (user + system of the supervisor and every
worker, from /proc) per call. The client runs on the same machine and its CPU is reported too.

    python -m bench.workers --model-dir models/all-minilm-l6-v2 --configs 1x2,2x1,2x2 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.common import ServiceProcess, conditions, summary
from bench.embed_throughput import load_sentences
from bench.procstat import cpu_seconds
from client import embed_request
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger("bench.workers")


async def send(address: str, sentences: list[str], clients: int) -> None:
    """All sentences, one per Embed call, from `clients` concurrent clients with a connection each."""
    pending = list(reversed(sentences))
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(clients)
    ]

    async def client(channel: grpc.aio.Channel) -> None:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        while pending:
            await stub.Embed(embed_request([pending.pop()]), timeout=60)

    try:
        await asyncio.gather(*(client(c) for c in channels))
    finally:
        await asyncio.gather(*(c.close() for c in channels))


def measure(models: Path, workers: int, compute: int, sentences: list[str], clients: int) -> dict:
    flags = ["--workers", str(workers), "--compute-workers", str(compute), "--intra-op-threads", "1"]
    group = ServiceProcess(models, flags, http=False)
    try:
        asyncio.run(send(group.address, sentences[: clients * 8], clients))  # warm-up
        server_start, client_start = cpu_seconds(group.proc.pid), resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        asyncio.run(send(group.address, sentences, clients))
        wall = time.perf_counter() - start
        server_cpu = cpu_seconds(group.proc.pid) - server_start  # the supervisor and every worker
        after = resource.getrusage(resource.RUSAGE_SELF)
        client_cpu = after.ru_utime + after.ru_stime - client_start.ru_utime - client_start.ru_stime
    finally:
        exit_code = group.stop()
    calls = len(sentences)
    return {
        "sentences_per_s": calls / wall,
        "server_cpu_us_per_call": server_cpu / calls * 1e6,
        "server_cores_busy": server_cpu / wall,
        "client_cpu_us_per_call": client_cpu / calls * 1e6,
        "exit_code": exit_code,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=Path("models/all-minilm-l6-v2"), help="embedding model directory")
    p.add_argument("--configs", default="1x2,2x1,2x2", help="WORKERSxCOMPUTE_THREADS, comma-separated")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data", type=Path, default=None, help="sentences file (default: STS-B dev + train)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sentences = load_sentences(args.data, args.calls)
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    runs: dict[str, list[dict]] = {c: [] for c in args.configs.split(",")}
    before = conditions()
    with tempfile.TemporaryDirectory() as root:  # a models root serving only this model
        (Path(root) / args.model_dir.name).symlink_to(args.model_dir.resolve(), target_is_directory=True)
        for r in range(args.rounds):
            for (workers, compute), name in zip(configs, runs):
                runs[name].append(measure(Path(root), workers, compute, sentences, args.clients))
                log.info("round %d %s: %s", r, name, runs[name][-1])
    result = {
        "model": args.model_dir.name,
        "calls": len(sentences),
        "clients": args.clients,
        "conditions_before": before,
        "conditions_after": conditions(),
        "configs": {name: {k: summary([run[k] for run in rs]) for k in rs[0]} for name, rs in runs.items()},
    }
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
