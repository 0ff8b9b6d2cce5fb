"""Soak test: mixed load with cancellations and deadlines for a set time, memory and gauges watched.

    python -m bench.soak --models models --duration 180
    python -m bench.soak --address 127.0.0.1:50051 --metrics-url http://127.0.0.1:9464/metrics --pid 1234

`--concurrency` clients loop over Embed, EmbedStream, Generate, GenerateStream and Translate; a
share of calls is cancelled after a random delay, another carries a short deadline. It samples the
server's RSS (summed over workers) and its in-flight and queue gauges, then prints a JSON report
(status counts, latency percentiles, RSS, gauges). Exits 1 on any INTERNAL or UNKNOWN status, a
gauge not back to 0 within 30 s after the load, or RSS growth beyond `--max-rss-growth`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import re
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.common import ServiceProcess, conditions
from bench.procstat import rss_mb
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger("bench.soak")
ROOT = Path(__file__).resolve().parents[1]
GAUGES = re.compile(r"^ts_\w*(queue_depth|in_flight)\w*$")  # what must be back to 0 when the load stops
BAD = {"INTERNAL", "UNKNOWN"}


def sentences() -> list[str]:
    lines = (ROOT / "tests" / "data" / "tatoeba-en-fr-160.txt").read_text().splitlines()
    return [line for line in lines[0::2] if line.strip()]  # the English side


def make_call(channel: grpc.aio.Channel, rng: random.Random, texts: list[str], dims: list[int]):
    """-> (rpc name, coroutine factory taking a timeout) for one random call with varied settings."""

    def pick(k: int) -> list[str]:
        return rng.sample(texts, k)

    kind = rng.choice(["Embed", "EmbedStream", "Generate", "GenerateStream", "Translate"])
    if kind.startswith("Embed"):
        stub = pb_grpc.EmbeddingServiceStub(channel)
        requests = [
            pb.EmbedRequest(inputs=pick(rng.randint(1, 8)), dimensions=rng.choice(dims), normalize=rng.random() < 0.8)
            for _ in range(rng.randint(1, 4))
        ]
        if kind == "Embed":
            return kind, lambda t: stub.Embed(requests[0], timeout=t)
        return kind, lambda t: _drain(stub.EmbedStream(iter(requests), timeout=t))
    if kind.startswith("Generate"):
        generation = pb_grpc.GenerationServiceStub(channel)
        request = pb.GenerateRequest(
            prompt=rng.choice(texts),
            max_new_tokens=rng.randint(4, 48),
            temperature=rng.choice([0.0, 0.7, 1.0]),
            top_k=rng.choice([0, 20]),
            top_p=rng.choice([0.0, 0.9]),
            stop=rng.choice([[], ["."]]),
        )
        if kind == "Generate":
            return kind, lambda t: generation.Generate(request, timeout=t)
        return kind, lambda t: _drain(generation.GenerateStream(request, timeout=t))
    translation = pb_grpc.TranslationServiceStub(channel)
    request = pb.TranslateRequest(
        inputs=pick(rng.randint(1, 4)), beam_size=rng.choice([1, 1, 2, 4]), max_length=rng.choice([0, 16, 32])
    )
    return kind, lambda t: translation.Translate(request, timeout=t)


async def _drain(call) -> None:
    async for _ in call:
        pass


class Load:
    """The clients' loops and what they saw: status counts and latencies by RPC."""

    def __init__(self, channel: grpc.aio.Channel, args: argparse.Namespace, dims: list[int]):
        self.channel, self.args, self.texts, self.dims = channel, args, sentences(), dims
        self.counts: Counter = Counter()
        self.latency: dict[str, list[float]] = defaultdict(list)

    async def client(self, seed: int, stop_at: float) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop_at:
            name, call = make_call(self.channel, rng, self.texts, self.dims)
            start = time.perf_counter()
            code = await self._one(rng, call)
            self.counts[name, code] += 1
            if code == "OK":
                self.latency[name].append(time.perf_counter() - start)

    async def _one(self, rng: random.Random, call) -> str:
        """Makes the call: cancelled by the client, with a short deadline, or with a long one."""
        roll = rng.random()
        try:
            if roll < self.args.cancel_share:  # the client gives up after a random delay
                await asyncio.wait_for(call(60.0), rng.uniform(0.001, 0.5))
            else:
                short = roll < self.args.cancel_share + self.args.deadline_share
                await call(rng.uniform(0.01, 0.5) if short else 60.0)
        except TimeoutError:
            return "CANCELLED"
        except grpc.aio.AioRpcError as e:
            if e.code().name in BAD:
                log.error("%s: %s", e.code().name, e.details())
            return e.code().name
        return "OK"

    def percentiles(self) -> dict[str, dict[str, float]]:
        """Latency of successful calls by RPC, in milliseconds."""
        return {
            name: {f"p{q}": round(float(np.percentile(v, q)) * 1000, 1) for q in (50, 90, 99)} | {"n": len(v)}
            for name, v in sorted(self.latency.items())
        }


def gauges(url: str) -> dict[str, float]:
    """In-flight and queue gauges of a metrics page: {"name{label=value}": value}."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if GAUGES.match(s.name):
                out[s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"] = s.value
    return out


class Watch:
    """Samples RSS and gauges every args.sample_every seconds until stopped."""

    def __init__(self, pid: int | None, metrics_url: str | None, every: float):
        self.pid, self.url, self.every = pid, metrics_url, every
        self.samples: list[dict] = []

    def sample(self, t0: float) -> dict:
        s: dict[str, Any] = {"t": round(time.monotonic() - t0, 1)}
        if self.pid:
            s["rss_mb"] = round(rss_mb(self.pid), 1)
        if self.url:
            s["gauges"] = gauges(self.url)
        self.samples.append(s)
        return s

    async def run(self, t0: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            s = await asyncio.to_thread(self.sample, t0)
            log.info(
                "t=%ss rss=%s MB busy gauges=%s",
                s["t"],
                s.get("rss_mb"),
                {k: v for k, v in s.get("gauges", {}).items() if v},
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)

    async def drained(self, t0: float, within: float = 30.0) -> dict[str, float]:
        """Polls until every gauge is 0 (or `within` passes); -> the last gauge values."""
        end = time.monotonic() + within
        while True:
            last = (await asyncio.to_thread(self.sample, t0)).get("gauges", {})
            if not any(last.values()) or time.monotonic() > end:
                return last
            await asyncio.sleep(0.5)


def memory(samples: list[dict], warmup: float) -> dict:
    rss = [(s["t"], s["rss_mb"]) for s in samples if "rss_mb" in s]
    if not rss:
        return {}
    after = [v for t, v in rss if t >= warmup] or [rss[-1][1]]
    return {
        "start_mb": after[0],
        "end_mb": rss[-1][1],
        "max_mb": max(v for _, v in rss),
        "first_mb": rss[0][1],
        "growth": round(rss[-1][1] / after[0] - 1, 3),
    }


async def soak(address: str, pid: int | None, metrics_url: str | None, args: argparse.Namespace) -> dict:
    watch = Watch(pid, metrics_url, args.sample_every)
    t0, stop = time.monotonic(), asyncio.Event()
    async with grpc.aio.insecure_channel(address) as channel:
        listed = await pb_grpc.ModelServiceStub(channel).ListModels(pb.ListModelsRequest(), timeout=30)
        full = next(m.embedding_dimension for m in listed.models if m.kind == "embedding" and m.is_default)
        load = Load(channel, args, [0, full // 2, full // 6])  # full size, and two cut sizes
        watcher = asyncio.create_task(watch.run(t0, stop))
        await asyncio.gather(*(load.client(args.seed + i, t0 + args.duration) for i in range(args.concurrency)))
        stop.set()
        await watcher
    last = await watch.drained(t0) if metrics_url else {}
    counts: defaultdict[str, dict[str, int]] = defaultdict(dict)
    for (name, code), n in sorted(load.counts.items()):
        counts[name][code] = n
    return {
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "calls": sum(load.counts.values()),
        "status": counts,
        "latency_ms": load.percentiles(),
        "rss": memory(watch.samples, args.warmup),
        "gauges_after": last,
        "samples": watch.samples,
    }


def verdict(report: dict, max_growth: float) -> list[str]:
    """Why the soak failed (empty: it passed)."""
    problems = [
        f"{name}: {n} {code}" for name, codes in report["status"].items() for code, n in codes.items() if code in BAD
    ]
    problems += [f"gauge {k} = {v} after the load stopped" for k, v in report["gauges_after"].items() if v]
    growth = report["rss"].get("growth")
    if growth is not None and growth > max_growth:
        problems.append(f"RSS grew {growth:.0%} after warm-up (limit {max_growth:.0%})")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="models", help="model root for the server it starts")
    parser.add_argument("--address", help="soak this server instead of starting one")
    parser.add_argument("--metrics-url", help="with --address: its metrics page")
    parser.add_argument("--pid", type=int, help="with --address: its process id (for RSS)")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cancel-share", type=float, default=0.1)
    parser.add_argument("--deadline-share", type=float, default=0.1)
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=20.0, help="RSS growth is measured from this time on")
    parser.add_argument("--max-rss-growth", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    server = None if args.address else ServiceProcess(Path(args.models), [], metrics=True)
    try:
        where: tuple[str, int | None, str | None] = (
            (server.address, server.proc.pid, server.metrics_url)
            if server
            else (args.address, args.pid, args.metrics_url)
        )
        report = asyncio.run(soak(*where, args))
    finally:
        if server:
            server.stop()
    report["problems"] = verdict(report, args.max_rss_growth)
    report["conditions"] = conditions()
    sys.stdout.write(json.dumps(report) + "\n")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
