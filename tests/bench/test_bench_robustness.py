"""bench/fuzz.py and bench/soak.py, run briefly against a real in-process server (tiny models)."""

from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path

from prometheus_client import REGISTRY

from bench import fuzz, soak
from service.proto import inference_pb2 as pb


def test_describe_cuts_long_values_short():
    request = pb.TranslateRequest(inputs=["x" * 5000] * 9, length_penalty=2.0)
    line = fuzz.describe(request)
    assert "(5000 characters)" in line and "… 9 items" in line and "length_penalty=2.0" in line
    assert len(line) < 600


def cpu_s() -> float:
    """This process's CPU seconds, by getrusage (the bench reads /proc/PID/stat)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mb() -> float:
    """This process's resident memory, from /proc/self/statm (the bench reads VmRSS)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def served(code: str) -> float:
    """Calls the server counted with this status code, over every RPC and door."""
    return sum(
        s.value
        for family in REGISTRY.collect()
        if family.name == "ts_requests"
        for s in family.samples
        if s.name == "ts_requests_total" and s.labels["code"] == code
    )


async def test_fuzz_session_reports_every_rpc(server):
    args = argparse.Namespace(requests=40, chunk=21, concurrency=4, timeout=60.0, seed=3)
    before = cpu_s()
    result = await fuzz.session(server.address, args, os.getpid())
    spent = cpu_s() - before  # the server runs in this process: its CPU is this process's
    assert result["requests"] == 40 and result["alive_after"]
    assert {key.split()[0] for key in result["counts"]} == {r.name for r in fuzz.rpcs()}
    assert all(row in result["table"] for row in ("| EmbeddingService/Embed |", "| all |"))
    assert spent > 0 and abs(result["server_cpu_s"] - spent) <= 0.15, (result["server_cpu_s"], spent)


async def test_soak_reports_statuses_memory_and_drained_gauges(server):
    args = argparse.Namespace(
        duration=3.0, concurrency=3, cancel_share=0.3, deadline_share=0.3, sample_every=1.0, warmup=0.0, seed=1
    )
    ok_before = served("OK")
    report = await soak.soak(server.address, os.getpid(), server.metrics_url, args)
    rss = rss_mb()
    ok = sum(codes.get("OK", 0) for codes in report["status"].values())
    assert report["calls"] == sum(n for codes in report["status"].values() for n in codes.values())
    assert 0 < ok <= served("OK") - ok_before  # every OK the soak saw, the server counted OK
    assert abs(report["rss"]["end_mb"] - rss) <= 0.25 * rss, (report["rss"], rss)  # the bench reads the right process
    assert set(report["gauges_after"]) >= {
        "ts_queue_depth{model=tiny-embed}",
        "ts_generations_in_flight{model=tiny-gpt}",
    }
    assert soak.verdict(report, max_growth=10.0) == []
    statuses = {code for codes in report["status"].values() for code in codes}
    # INVALID_ARGUMENT: the tiny models take 48 tokens of one byte each; some sentences are longer
    assert statuses <= {"OK", "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"}, statuses
    assert "OK" in statuses
