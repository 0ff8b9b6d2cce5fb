"""Hostile clients against the service's lifecycle and memory (issue 33): probes against a real process.

    python -m bench.hostile_lifecycle --models models [--only drain,unread,refused,overload,signals,metrics]

Each probe starts `python -m service` (bench.common.ServiceProcess) and prints one row: `drain` (a
window-0 health Watch open, plus 200 on a closed connection, then SIGTERM: exit code and seconds),
`unread` (rounds of 10,000 unary calls on one raw HTTP/2 connection whose answers are never read:
RSS per round and after idle, the worst health latency meanwhile), `refused` (15 MB gRPC requests
of every kind refused at once: RSS after idle vs the start), `overload` (40 concurrent Embed calls
against a 64-input queue: RESOURCE_EXHAUSTED vs the same burst refused as INVALID_ARGUMENT, p50 /
p99 ms of the refused calls, bursts alternated), `signals` (SIGHUP and SIGUSR1 while loading, SIGUSR1
while serving) and `metrics` (250 half-sent requests to the metrics port: the server's threads).
`--workers` probes are in bench/hostile_workers.py. The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, cast

import grpc
from grpc_health.v1 import health_pb2

from bench.common import ROOT, ServiceProcess, conditions
from bench.hostile import Health
from bench.procstat import rss_mb
from bench.rawh2 import RawGrpc
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

BIG = "hello " * 2621440  # 15 MiB, under the 16 MiB message limit
WATCH = "/grpc.health.v1.Health/Watch"
LIST = "/inference.v1.ModelService/ListModels"


def drain(models: Path, idle: float) -> dict:
    server = ServiceProcess(models, ["--grace-seconds", "10"])
    closed = RawGrpc(server.address, window=0)
    for _ in range(200):
        closed.call(WATCH, health_pb2.HealthCheckRequest().SerializeToString())
    closed.flush()
    closed.pump(0.5)
    closed.close()
    stuck = RawGrpc(server.address, window=0)
    stuck.call(WATCH, health_pb2.HealthCheckRequest().SerializeToString())
    stuck.flush()
    stuck.pump(0.5)
    start = time.perf_counter()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(60)
        out: dict[str, object] = {"exit_code": code, "exit_s": round(time.perf_counter() - start, 2)}
    except Exception:
        server.proc.kill()
        out = {"exit_code": None, "exit_s": "no exit in 60 s (killed)"}
    stuck.close()
    return out


def unread(models: Path, idle: float, rounds: int = 3, calls: int = 10000) -> dict:
    server = ServiceProcess(models, [])
    health = Health(server.http_url, server.address)
    health.start()
    try:
        rss, t0 = [round(rss_mb(server.proc.pid))], time.perf_counter()
        for _ in range(rounds):
            raw, sent = RawGrpc(server.address), 0
            try:
                for i in range(calls):
                    raw.call(LIST, pb.ListModelsRequest().SerializeToString())
                    sent += 1
                    if i % 100 == 99:
                        raw.flush()
                        time.sleep(0.01)
                raw.flush()
            except OSError:
                pass  # the server closed the connection of a client past its stream bound
            time.sleep(3)
            raw.close()
            time.sleep(1)
            rss.append(round(rss_mb(server.proc.pid)))
        worst = health.worst(t0, time.perf_counter())
        time.sleep(idle)
        return {
            "rss_mib_per_round": rss,
            "rss_after_idle_mib": round(rss_mb(server.proc.pid)),
            "sent_last": sent,
            "worst_health_ms": round(worst * 1e3, 1),
        }
    finally:
        health.stopping = True
        server.stop()


def refused(models: Path, idle: float) -> dict:
    server = ServiceProcess(models, [])
    options = [("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        embed = pb_grpc.EmbeddingServiceStub(channel)
        embed.Embed(pb.EmbedRequest(inputs=["warm"]))
        start = rss_mb(server.proc.pid)
        calls = [
            lambda: embed.Embed(pb.EmbedRequest(inputs=[BIG], truncate=False), timeout=120),
            lambda: pb_grpc.GenerationServiceStub(channel).Generate(pb.GenerateRequest(prompt=BIG), timeout=120),
            lambda: pb_grpc.TranslationServiceStub(channel).Translate(pb.TranslateRequest(inputs=[BIG]), timeout=120),
            lambda: pb_grpc.FillMaskServiceStub(channel).FillMask(
                pb.FillMaskRequest(inputs=[BIG + "[MASK]"]), timeout=120
            ),
        ]
        codes, peak = set(), start
        for call in calls[:1] * 3 + calls:
            try:
                call()
                codes.add("OK")
            except grpc.RpcError as e:
                codes.add(e.code().name)
            peak = max(peak, rss_mb(server.proc.pid))
    time.sleep(idle)
    after = rss_mb(server.proc.pid)
    server.stop()
    return {
        "codes": sorted(codes),
        "rss_start_mib": round(start),
        "rss_peak_mib": round(peak),
        "rss_after_idle_mib": round(after),
        "ratio": round(after / start, 2),
    }


async def _burst(address: str, inputs: int, n: int = 40) -> list[tuple[str, float]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        await channel.channel_ready()
        texts = [f"a sentence of some words, number {i}" for i in range(inputs)]

        async def one() -> tuple[str, float]:
            start = time.perf_counter()
            try:
                await stub.Embed(pb.EmbedRequest(inputs=texts), timeout=30)
                code = "OK"
            except grpc.aio.AioRpcError as e:
                code = e.code().name
            return code, time.perf_counter() - start

        return await asyncio.gather(*(one() for _ in range(n)))


def overload(models: Path, idle: float, rounds: int = 10) -> dict:
    flags = ["--embed-max-queue", "64", "--embed-max-inputs", "64", "--compute-workers", "1"]
    server = ServiceProcess(models, flags)
    lat: dict[str, list[float]] = {"RESOURCE_EXHAUSTED": [], "INVALID_ARGUMENT": []}
    try:
        for _ in range(rounds):
            for inputs in (64, 65):  # 64: one call fills the queue; 65: every call is too large
                for code, seconds in asyncio.run(_burst(server.address, inputs)):
                    if code in lat:
                        lat[code].append(seconds * 1e3)
    finally:
        server.stop()
    return {code: _p50_p99(values) for code, values in lat.items()}


def _p50_p99(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=100)
    return {"n": len(values), "p50_ms": round(statistics.median(values), 1), "p99_ms": round(q[98], 1)}


def signals(models: Path, idle: float) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--models",
        str(models),
        "--port",
        "0",
        "--http-port",
        "-1",
        "--metrics-port",
        "-1",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    out: dict[str, object] = {}
    for line in cast(IO[str], proc.stderr):  # stderr=PIPE, text=True
        if "gRPC listening" in line:  # bound, still warming up
            for sig in (signal.SIGHUP, signal.SIGUSR1):
                proc.send_signal(sig)
            break
    time.sleep(3)
    out["alive_after_sighup_sigusr1_while_loading"] = proc.poll() is None
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        out["alive_after_sigusr1_serving"] = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
    try:
        out["exit_code"] = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out["exit_code"] = None
    return out


def metrics(models: Path, idle: float, connections: int = 250) -> dict:
    server = ServiceProcess(models, [], metrics=True)
    host, port = server.metrics_url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    threads0 = _threads(server.proc.pid)
    socks = []
    for _ in range(connections):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")  # never finished
        socks.append(sock)
    time.sleep(2)
    held = _threads(server.proc.pid)
    time.sleep(max(idle, 12))
    later = _threads(server.proc.pid)
    for sock in socks:
        sock.close()
    server.stop()
    return {"threads_before": threads0, "threads_with_idle_connections": held, "threads_later": later}


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


PROBES = {
    "drain": drain,
    "unread": unread,
    "refused": refused,
    "overload": overload,
    "signals": signals,
    "metrics": metrics,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_lifecycle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="folder of model directories (every kind)")
    parser.add_argument("--only", default="", help="comma-separated probe names (default: all)")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds without calls before an idle RSS")
    args = parser.parse_args(argv)
    before, results = conditions(), {}
    for name, probe in PROBES.items():
        if not args.only or name in args.only.split(","):
            results[name] = probe(args.models, args.idle)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    print(json.dumps({"results": results, "conditions": before, "after": conditions()["load_average"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
