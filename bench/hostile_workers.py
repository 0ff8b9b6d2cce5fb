"""Hostile conditions for `--workers 2` (issue 33, item 7): probes against a real supervisor.

    python -m bench.hostile_workers --models models [--only restart,stopped]

`restart`: a group on fixed ports drains on SIGTERM with HTTP keep-alive connections open (their
closed ends wait in TIME_WAIT), then a new group starts on the same ports: seconds until it serves,
and the failed tries meanwhile. `stopped`: one worker is stopped (SIGSTOP, standing in for a blocked
event loop); 20 calls on new connections, one every 0.5 s with a 2 s deadline: how many time out,
and seconds until the supervisor has a replacement serving. The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, cast

import grpc

from bench.common import ROOT, conditions
from bench.procstat import tree
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc


class Group:
    """`python -m service --workers 2` on the given ports; `ready` once every worker serves (or None)."""

    def __init__(self, models: Path, port: int, http_port: int, timeout: float = 180):
        cmd = [sys.executable, "-m", "service", "--models", str(models), "--workers", "2", "--port", str(port)]
        cmd += ["--http-port", str(http_port), "--metrics-port", "-1", "--compute-workers", "1"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        self.address, self.http = f"127.0.0.1:{port}", f"127.0.0.1:{http_port}"
        self.log: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05) and self.proc.poll() is None and time.monotonic() < deadline:
            pass

    def _read(self) -> None:
        for line in cast(IO[str], self.proc.stderr):  # stderr=PIPE, text=True
            self.log.append(line)
            if "workers serving on" in line:
                self.ready.set()

    def pid(self, worker: int) -> int:
        return int([m for line in self.log if (m := re.search(rf"worker {worker} ready \(pid (\d+)\)", line))][-1][1])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)

    def kill(self) -> None:
        """The supervisor and its workers, when a probe failed half-way (they hold our stdout)."""
        if self.proc.poll() is None:
            for pid in tree(self.proc.pid)[1:]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait(30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _embed_once(address: str, timeout: float) -> str:
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        try:
            pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(inputs=["hi"]), timeout=timeout)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name


def restart(models: Path) -> dict:
    port, http_port = _free_port(), _free_port()
    first = Group(models, port, http_port)
    try:
        kept = [http.client.HTTPConnection(first.http) for _ in range(4)]
        for conn in kept:
            conn.request("GET", "/health")
            conn.getresponse().read()
        first_exit = first.stop()
    finally:
        first.kill()
    start, failures, reason = time.perf_counter(), 0, ""
    while time.perf_counter() - start < 120:
        group = Group(models, port, http_port)
        if group.ready.is_set():
            seconds = round(time.perf_counter() - start, 1)
            group.stop()
            return {"first_exit": first_exit, "serving_after_s": seconds, "failed_starts": failures, "why": reason}
        failures += 1
        reason = next((line.strip()[-90:] for line in group.log if "cannot" in line), reason)
        group.proc.wait(30)
        time.sleep(2)
    return {"first_exit": first_exit, "serving_after_s": None, "failed_starts": failures, "why": reason}


def stopped(models: Path) -> dict:
    group = Group(models, _free_port(), _free_port())
    try:
        victim = group.pid(0)
        os.kill(victim, signal.SIGSTOP)
        start, codes = time.perf_counter(), []
        for _ in range(20):
            codes.append(_embed_once(group.address, 2.0))
            time.sleep(0.5)
        replaced = None
        while time.perf_counter() - start < 60 and replaced is None:
            if any(re.search(rf"worker 0 ready \(pid (?!{victim}\))", line) for line in group.log):
                replaced = round(time.perf_counter() - start, 1)
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):  # gone when the supervisor replaced it
            os.kill(victim, signal.SIGCONT)
        code = group.stop()
    finally:
        group.kill()
    timed_out = sum(c == "DEADLINE_EXCEEDED" for c in codes)
    return {"calls": len(codes), "timed_out": timed_out, "replaced_after_s": replaced, "exit": code}


PROBES = {"restart": restart, "stopped": stopped}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="folder of model directories")
    parser.add_argument("--only", default="", help="comma-separated probe names (default: all)")
    args = parser.parse_args(argv)
    before, results = conditions(), {}
    for name, probe in PROBES.items():
        if not args.only or name in args.only.split(","):
            results[name] = probe(args.models)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    print(json.dumps({"results": results, "conditions": before, "after": conditions()["load_average"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
