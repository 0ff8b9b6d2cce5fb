"""Serving overhead: server CPU per call and per token, Embed vs sentence-transformers, overload latency.

Parts (`--parts`, default all), each against a real `python -m service` subprocess:
- cpu: server CPU (/proc) per 1-input Embed call (32 in flight) and per generated token (64
  concurrent GenerateStream calls, also with `--gen-interval-ms`), on the tiny models (`--tiny`,
  built when absent: the serving layer's own cost) and the default models, with wall-clock rates
  and the mean rows per embedding batch; gen: its generation figure alone (tiny models);
- streams: 8 concurrent greedy streams against 1 on the default generator (rounds alternate);
- st: 16 concurrent 1-sentence Embed clients vs sentence-transformers in process, same sentences;
- overload: a 10x burst over small queues: latency of RESOURCE_EXHAUSTED answers vs validation
  refusals (the floor), and the accepted calls' p99 vs unloaded.
CPU time holds up on a shared machine; wall-clock figures are noisy there.

    python -m bench.overhead --parts cpu,overload
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np

from bench.common import ROOT, ServiceProcess, conditions, histogram_delta, scrape_histogram
from bench.embed_throughput import load_sentences, resolve_model, run_clients, sentence_transformers_run
from client import embed_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger("bench.overhead")
TICK = os.sysconf("SC_CLK_TCK")
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
# 16 of these make a call of ~10k characters: tokenized in a thread, as large calls are.
LONG_TEXT = " ".join(["Serving overhead is measured with long inputs that take a while to tokenize."] * 8)
STSB = [ROOT.parent / "shared" / "data" / "stsb", ROOT.parents[1] / "shared" / "data" / "stsb"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1e3, 2) if values else None


async def embed_calls(address: str, calls: int, concurrency: int, inputs: list[str], packed: bool = False) -> float:
    """Sends `calls` Embed calls of `inputs`, `concurrency` at a time; returns wall seconds."""
    request = embed_request(inputs, packed=True) if packed else embed_request(inputs)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        left = [calls]

        async def client() -> None:
            while left[0] > 0:
                left[0] -= 1
                await stub.Embed(request, timeout=60)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - start


async def generate_streams(
    address: str, streams: int, tokens: int, seed: int = 0, interval_ms: int = 0, temperature: float = 0.8
) -> tuple[float, int, int]:
    """`streams` concurrent GenerateStream calls of `tokens` new tokens (sampled, seeded; temperature 0:
    greedy), messages `interval_ms` apart -> (wall seconds, tokens received, messages received)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)

        async def one(i: int) -> tuple[int, int]:
            request = pb.GenerateRequest(
                prompt=f"Once upon a time {i}", max_new_tokens=tokens, temperature=temperature, seed=seed + i
            )
            if interval_ms:  # set only when asked: the bench also runs against servers that predate the field
                request.stream_interval_ms = interval_ms
            sizes = [len(c.token_ids) async for c in stub.GenerateStream(request, timeout=120)]
            return sum(sizes), len(sizes)

        start = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        return time.perf_counter() - start, sum(t for t, _ in counts), sum(m for _, m in counts)


def measure_streams(
    pid: int,
    address: str,
    streams: int,
    tokens: int,
    rounds: int,
    interval_ms: int = 0,
    temperature: float = 0.8,
    metrics_url: str = "",
) -> dict:
    """Server CPU per token, tokens/s and messages per token over `rounds` rounds of concurrent streams
    (and the mean time to first token from the server's histogram, given its metrics URL)."""
    ttft = scrape_histogram(metrics_url, "ts_time_to_first_token_seconds") if metrics_url else None
    before, wall, received, messages = cpu_seconds(pid), 0.0, 0, 0
    for r in range(rounds):
        seconds, n, m = asyncio.run(generate_streams(address, streams, tokens, 1000 * r, interval_ms, temperature))
        wall, received, messages = wall + seconds, received + n, messages + m
    cpu = cpu_seconds(pid) - before
    out: dict[str, float | None] = {
        "streams": streams,
        "stream_interval_ms": interval_ms,
        "tokens": received,
        "server_cpu_us_per_token": round(cpu / received * 1e6, 1),
        "tokens_per_s": round(received / wall, 1),
        "messages_per_token": round(messages / received, 3),
    }
    if ttft is not None:
        end = scrape_histogram(metrics_url, "ts_time_to_first_token_seconds")
        count = end.get("count", 0.0) - ttft.get("count", 0.0)
        out["mean_time_to_first_token_ms"] = (
            round((end["sum"] - ttft.get("sum", 0.0)) / count * 1e3, 1) if count else None
        )
    return out


def measure_cpu(models: Path, label: str, embed_calls_n: int, gen_rounds: int, interval_ms: int) -> dict:
    """Server CPU per 1-input Embed call (32 in flight) and per generated token (64 streams x 40,
    each message as soon as its tokens are ready, then `interval_ms` apart)."""
    service = ServiceProcess(models, [], metrics=True)
    pid = service.proc.pid
    try:
        asyncio.run(embed_calls(service.address, 200, 32, [SENTENCE]))  # warm-up
        embed = {}
        for packed in (False, True):
            before, batches = cpu_seconds(pid), scrape_histogram(service.metrics_url, "ts_batch_size")
            wall = asyncio.run(embed_calls(service.address, embed_calls_n, 32, [SENTENCE], packed))
            rows = histogram_delta(batches, scrape_histogram(service.metrics_url, "ts_batch_size"))["mean"]
            embed["packed" if packed else "float"] = {
                "server_cpu_us_per_call": round((cpu_seconds(pid) - before) / embed_calls_n * 1e6, 1),
                "calls_per_s": round(embed_calls_n / wall, 1),
                "rows_per_batch": rows,
            }
        asyncio.run(generate_streams(service.address, 16, 8))  # warm-up
        generate = [measure_streams(pid, service.address, 64, 40, gen_rounds)]
        if interval_ms:
            generate.append(measure_streams(pid, service.address, 64, 40, gen_rounds, interval_ms))
    finally:
        service.stop()
    return {"models": label, "embed": {"calls": embed_calls_n, "in_flight": 32, **embed}, "generate": generate}


def streams_scaling(models: Path, rounds: int) -> dict:
    """The default generation model: 8 concurrent greedy streams of 128 tokens against 1, through a real
    server (tokens/s, server CPU per token); rounds alternate."""
    service = ServiceProcess(models, [])
    pid = service.proc.pid
    try:
        asyncio.run(generate_streams(service.address, 8, 8, temperature=0.0))  # warm-up
        runs = [
            [measure_streams(pid, service.address, n, 128, 1, temperature=0.0) for n in (1, 8)] for _ in range(rounds)
        ]
    finally:
        service.stop()
    ratios = [eight["tokens_per_s"] / one["tokens_per_s"] for one, eight in runs]
    return {"rounds": runs, "ratio_8_to_1": sorted(round(r, 2) for r in ratios)}


def measure_generation(models: Path, rounds: int, interval_ms: int) -> list[dict]:
    """Per generated token only (64 streams x 40), without the Embed calls of `measure_cpu`."""
    service = ServiceProcess(models, [], metrics=True)
    try:
        asyncio.run(generate_streams(service.address, 16, 8))  # warm-up
        pid, address, url = service.proc.pid, service.address, service.metrics_url
        out = [measure_streams(pid, address, 64, 40, rounds, metrics_url=url)]
        if interval_ms:
            out.append(measure_streams(pid, address, 64, 40, rounds, interval_ms, metrics_url=url))
    finally:
        service.stop()
    return out


def versus_st(models: Path, sentences: int, variant: str = "auto") -> dict:
    """16 concurrent 1-sentence clients vs sentence-transformers (batch 8, 2 threads), same sentences;
    the service serves the embedding graph `variant` (auto: the served default)."""
    data = next((d / "sts-dev.csv" for d in STSB if d.is_dir()), None)
    texts = load_sentences(data, sentences)
    service = ServiceProcess(models, ["--variant", variant])
    try:
        name = asyncio.run(resolve_model(service.address, ""))
        before = cpu_seconds(service.proc.pid)
        seconds, served = asyncio.run(run_clients(service.address, texts, 16, name))
        cpu = cpu_seconds(service.proc.pid) - before
    finally:
        service.stop()
    st_seconds, reference = sentence_transformers_run(texts, 8, 2)
    cos = (served * reference).sum(axis=1) / np.linalg.norm(served, axis=1) / np.linalg.norm(reference, axis=1)
    return {
        "variant": variant,
        "sentences": len(texts),
        "service_sentences_per_s": round(len(texts) / seconds, 1),
        "service_cpu_ms_per_sentence_incl_warmup": round(cpu / (len(texts) + 64) * 1e3, 2),
        "st_sentences_per_s": round(len(texts) / st_seconds, 1),
        "ratio": round(st_seconds / seconds, 3),
        "min_cosine": round(float(cos.min()), 6),
    }


async def _timed(make_call) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        await make_call()
        code = "OK"
    except grpc.aio.AioRpcError as e:
        code = e.code().name
    return code, time.perf_counter() - start


async def burst(address: str, calls: int, make, connections: int = 16) -> dict[str, list[float]]:
    """`calls` calls at once over `connections` channels; latencies (seconds) by status code."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(connections)]
    try:
        await asyncio.gather(*(c.channel_ready() for c in channels))
        results = await asyncio.gather(*(_timed(make(channels[i % connections], i)) for i in range(calls)))
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    by_code: dict[str, list[float]] = {}
    for code, seconds in results:
        by_code.setdefault(code, []).append(seconds)
    return by_code


def _latencies(by_code: dict[str, list[float]]) -> dict:
    return {code: {"n": len(v), "p50_ms": pct(v, 50), "p99_ms": pct(v, 99)} for code, v in by_code.items()}


def overload(models: Path) -> dict:
    """10x bursts against small queues: refusal latency vs the validation floor, accepted p99 vs unloaded."""
    service = ServiceProcess(models, ["--embed-max-queue", "64", "--gen-max-queue", "8"])
    long_inputs, bad_inputs = [LONG_TEXT] * 16, [LONG_TEXT] * 15 + [""]

    def embed(inputs):
        return lambda ch, i: lambda: pb_grpc.EmbeddingServiceStub(ch).Embed(embed_request(inputs), timeout=60)

    async def drain(ch, request):
        async for _ in pb_grpc.GenerationServiceStub(ch).GenerateStream(request, timeout=60):
            pass

    def gen(temperature: float):
        return lambda ch, i: (
            lambda: drain(
                ch,
                pb.GenerateRequest(prompt=f"Once upon a time {i}", max_new_tokens=40, temperature=temperature, seed=i),
            )
        )

    try:
        unloaded = [asyncio.run(burst(service.address, 1, embed(long_inputs), 1))["OK"][0] for _ in range(10)]
        asyncio.run(burst(service.address, 40, embed(bad_inputs)))  # warm-up of 16 connections
        out = {
            "embed": {
                "unloaded_p99_ms": pct(unloaded, 99),
                "burst_40x16_long": _latencies(asyncio.run(burst(service.address, 40, embed(long_inputs)))),
                "floor_invalid": _latencies(asyncio.run(burst(service.address, 40, embed(bad_inputs)))),
            }
        }
        gen_unloaded = [asyncio.run(burst(service.address, 1, gen(0.8), 1))["OK"][0] for _ in range(5)]
        out["generate"] = {
            "unloaded_p99_ms": pct(gen_unloaded, 99),
            "burst_80": _latencies(asyncio.run(burst(service.address, 80, gen(0.8)))),
            "floor_invalid": _latencies(asyncio.run(burst(service.address, 80, gen(-1.0)))),
        }
    finally:
        service.stop()
    return out


def tiny_models(path: Path) -> Path:
    if not (path / "tiny-embed" / "model.json").exists():
        subprocess.run(
            [sys.executable, "-m", "export", "tiny", "--kind", "all", "--out", str(path)],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=ROOT / "models", help="default models root")
    p.add_argument(
        "--tiny", type=Path, default=ROOT / "build" / "bench-tiny", help="tiny models root (built if absent)"
    )
    p.add_argument(
        "--parts",
        default="cpu,st,overload",
        help="comma-separated: cpu, gen (generation only, tiny models), streams, st, overload",
    )
    p.add_argument("--embed-calls", type=int, default=3000)
    p.add_argument("--gen-rounds", type=int, default=6, help="rounds of 64 streams x 40 tokens")
    p.add_argument(
        "--gen-interval-ms",
        type=int,
        default=50,
        help="a second generation figure with GenerateRequest.stream_interval_ms (0: none)",
    )
    p.add_argument("--scaling-rounds", type=int, default=3, help="rounds of 1 vs 8 streams (part 'streams')")
    p.add_argument("--sentences", type=int, default=1500, help="sentences of the sentence-transformers comparison")
    p.add_argument(
        "--st-variants",
        default="auto",
        help="comma-separated embedding graph variants served in the sentence-transformers comparison, e.g. auto,int8",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    parts = set(args.parts.split(","))
    result: dict = {"conditions": conditions()}
    if "cpu" in parts:
        result["cpu"] = [
            measure_cpu(tiny_models(args.tiny), "tiny", args.embed_calls, args.gen_rounds, args.gen_interval_ms),
            measure_cpu(args.models, "default", args.embed_calls // 3, 1, args.gen_interval_ms),
        ]
    if "gen" in parts:
        result["gen"] = measure_generation(tiny_models(args.tiny), args.gen_rounds, args.gen_interval_ms)
    if "streams" in parts:
        result["streams"] = streams_scaling(args.models, args.scaling_rounds)
    if "overload" in parts:
        result["overload"] = overload(args.models)
    if "st" in parts:  # last: it loads torch into this process
        result["vs_sentence_transformers"] = [
            versus_st(args.models, args.sentences, v) for v in args.st_variants.split(",")
        ]
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
