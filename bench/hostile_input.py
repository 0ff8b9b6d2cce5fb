"""Hostile input, second round (issue 33, the HTTP and decoding items): probes against a real server.

    python -m bench.hostile_input --models models [--only kserve_shape_rest,emfile]

Starts `python -m service` (a bearer token with a non-ASCII character, metrics on) and runs each
probe while bench.hostile's thread checks HTTP `/health` and gRPC `Health/Check` every 50 ms. Per
probe: what the server answered (a 5xx, INTERNAL or UNKNOWN is marked BAD), the worst health
latency, the server's CPU seconds and RSS, and the ERROR lines and tracebacks it logged. The
probes: KServe shapes of many huge dimensions (REST and gRPC), 15 MB bodies of millions of small
elements on every JSON route and gRPC KServe raw BYTES, KServe decoding failures, the listener
at the file-descriptor limit, clients that never read a large answer, a UTF-8 bearer token, and
gzip bodies of two members or with bytes after the stream. The last line of stdout is JSON.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import re
import socket
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench.common import ServiceProcess, conditions
from bench.hostile import Health, errors_logged
from bench.procstat import cpu_seconds, rss_mb
from service.kserve.arrays import LENGTH
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc

TOKEN = "hostile-input-token"
UTF8_TOKEN = "hostile-tökén"  # not ASCII: sent as UTF-8 over HTTP (gRPC clients send ASCII only)
MANY = 3_750_000  # small elements in a 15 MB body


def kinds(models: Path) -> dict[str, str]:
    """kind -> the first model of that kind under models."""
    out: dict[str, str] = {}
    for manifest in sorted(models.glob("*/model.json")):
        out.setdefault(json.loads(manifest.read_text())["kind"], manifest.parent.name)
    return out


class Probes:
    def __init__(self, server: ServiceProcess, models: Path, timeout: float):
        self.server, self.timeout, self.models, self.models_root = server, timeout, kinds(models), models
        host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(server.address, options=options)
        self.auth = (("authorization", f"Bearer {TOKEN}"),)
        self.oip = oip_grpc.GRPCInferenceServiceStub(self.channel)
        self.bodies = {
            "prompts": _compact({"prompt": ["a"] * MANY, "max_tokens": 1}),
            "ids": _compact({"prompt": [1] * 2 * MANY, "max_tokens": 1}),
            "nested": b'{"input": ' + b"[" * 29 + b"[]," * (5_000_000 - 1) + b"[]" + b"]" * 29 + b"}",  # 30 deep
            "tokens": _compact({"tokens": [1] * 2 * MANY}),
            "inputs": _compact({"inputs": ["a"] * MANY}),
        }

    def post(self, path: str, body: bytes, headers: Mapping[str, str | bytes] | None = None) -> str:
        """'<status> <message>' of one POST; header values as bytes go as they are."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.putrequest("POST", path)
            sent: dict[str, str | bytes] = {
                "authorization": f"Bearer {TOKEN}".encode(),
                "content-type": "application/json",
            }
            for name, value in {**sent, **(headers or {})}.items():
                conn.putheader(name, value)
            conn.putheader("content-length", str(len(body)))
            conn.endheaders(body)
            reply = conn.getresponse()
            text = reply.read().decode("utf-8", "replace")
        finally:
            conn.close()
        try:
            error = json.loads(text).get("error", "")
        except ValueError:
            error = text
        message = error.get("message", "") if isinstance(error, dict) else str(error)
        return f"{reply.status} {message[:60]}".strip()

    def infer_rest(self, inputs: list[dict], **extra) -> str:
        body = json.dumps({"inputs": inputs, **extra}).encode()
        return self.post(f"/v2/models/{self.models['embedding']}/infer", body)

    def infer_grpc(self, request: oip.ModelInferRequest) -> str:
        request.model_name = self.models["embedding"]
        try:
            self.oip.ModelInfer(request, timeout=self.timeout, metadata=self.auth)
            return "OK"
        except grpc.RpcError as e:
            return f"{e.code().name}: {(e.details() or '')[:60]}"

    # item 3
    def kserve_shape_rest(self) -> str:
        return self.infer_rest([{"name": "text", "datatype": "BYTES", "shape": [2**62] * 120000, "data": ["a"]}])

    def kserve_shape_grpc(self) -> str:
        request = oip.ModelInferRequest()
        request.inputs.add(name="text", datatype="BYTES", shape=[2**62] * 60000).contents.bytes_contents.append(b"a")
        return self.infer_grpc(request)

    # item 4 (bodies built before the probe: building them holds this process's GIL, the health thread's too)
    def many_prompts(self) -> str:
        return self.post("/v1/completions", self.bodies["prompts"])

    def many_token_ids(self) -> str:
        return self.post("/v1/completions", self.bodies["ids"])

    def nested_embeddings(self) -> str:
        return self.post("/v1/embeddings", self.bodies["nested"])

    def detokenize_many(self) -> str:
        return self.post("/detokenize", self.bodies["tokens"])

    def translate_many(self) -> str:
        return self.post("/v1/translate", self.bodies["inputs"])

    def fill_mask_many(self) -> str:
        return self.post("/v1/fill-mask", self.bodies["inputs"])

    def kserve_raw_many(self) -> str:
        out = []
        for shape in ([MANY], [1]):
            request = oip.ModelInferRequest(raw_input_contents=[LENGTH.pack(0) * MANY])
            request.inputs.add(name="text", datatype="BYTES", shape=shape)
            out.append(f"{shape if shape == [1] else '[N]'} {self.infer_grpc(request)[:40]}")
        return "; ".join(out)

    # item 5
    def kserve_decoding(self) -> str:
        text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}
        cases = {
            "surrogate": self.post(
                f"/v2/models/{self.models['embedding']}/infer",
                b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}',
            ),
            "header ²": self.post(
                f"/v2/models/{self.models['embedding']}/infer",
                json.dumps({"inputs": [text]}).encode(),
                {"inference-header-content-length": "\xb2"},
            ),
            "65 dims": self.infer_rest([{**text, "shape": [0] * 65, "data": []}]),
            "[0,2**64]": self.infer_rest([{**text, "shape": [0, 2**64], "data": []}]),
            "[0,2**40,2**40]": self.infer_rest([{**text, "shape": [0, 2**40, 2**40], "data": []}]),
            "[2**62]*300": self.infer_rest([{**text, "shape": [2**62] * 300}]),
            "FP32 10**400": self.infer_rest([{"name": "x", "datatype": "FP32", "shape": [1], "data": [10**400]}]),
            "FP64 10**400": self.infer_rest([{"name": "x", "datatype": "FP64", "shape": [1], "data": [10**400]}]),
            "id surrogate": self.post(
                f"/v2/models/{self.models['embedding']}/infer",
                b'{"id": "\\ud800", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}',
            ),
        }
        request = oip.ModelInferRequest()
        request.inputs.add(name="text", datatype="BYTES", shape=[0] * 65)
        cases["grpc 65 dims"] = self.infer_grpc(request)
        return "; ".join(f"{k}: {v[:3] if v[0].isdigit() else v.split(':')[0]}" for k, v in cases.items())

    # item 6
    def emfile(self, limit: int = 160, idle: int = 280, wait: float = 5.0) -> str:
        """A server of its own started under RLIMIT_NOFILE=limit; `idle` connections opened to its HTTP
        port, then to its gRPC port: the log lines and CPU of each, and whether a call still works."""
        server = ServiceProcess(self.models_root, [], keep_log=True, max_files=limit)
        stub = pb_grpc.ModelServiceStub(grpc.insecure_channel(server.address))
        stub.ListModels(pb.ListModelsRequest(), timeout=30, metadata=self.auth)  # the channel is connected
        try:
            return "; ".join(
                f"{door}: {self._flood(server, stub, address, idle, wait)}"
                for door, address in (("HTTP", server.http_url.removeprefix("http://")), ("gRPC", server.address))
            )
        finally:
            server.stop()

    def _flood(self, server: ServiceProcess, stub, address: str, idle: int, wait: float) -> str:
        host, port = address.rsplit(":", 1)
        pid, socks = server.proc.pid, []
        lines0, cpu0 = len(server.log), cpu_seconds(pid)
        try:
            for _ in range(idle):
                socks.append(socket.create_connection((host, int(port)), timeout=self.timeout))
            time.sleep(wait)
            cpu, lines = cpu_seconds(pid) - cpu0, server.log[lines0:]
            try:
                stub.ListModels(pb.ListModelsRequest(), timeout=5, metadata=self.auth)
                call = "OK"
            except grpc.RpcError as e:
                call = e.code().name
        finally:
            for sock in socks:
                sock.close()
        tracebacks = sum(line.startswith("Traceback") for line in lines)
        return f"{len(lines)} log lines ({tracebacks} tracebacks), {cpu:.2f} CPU-s in {wait:g} s, a call: {call}"

    # item 8
    def unread_answers(self, connections: int = 30, wait: float = 90.0) -> str:
        """A server of its own: `connections` clients send /tokenize for a ~10 MB answer and never read
        it. RSS while they hold it and `wait` s later (still connected), and how many the server closed."""
        body = _compact({"prompt": "hello " * 170_000, "return_token_strs": True})
        head = f"POST /tokenize HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        request = head.encode() + b"\r\nauthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n" + body
        server = ServiceProcess(self.models_root, [], metrics=True, keep_log=True)
        pid, socks, rss0 = server.proc.pid, [], rss_mb(server.proc.pid)
        try:
            for _ in range(connections):
                host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
                sock = socket.create_connection((host, int(port)))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(request)
                socks.append(sock)
            time.sleep(25)
            held = rss_mb(pid)
            time.sleep(wait - 25)
            after, closed = rss_mb(pid), _closed(server, "write_timeout")
            for sock in socks:
                sock.close()
        finally:
            server.stop()
        return f"RSS {rss0:.0f} → {held:.0f} held at 25 s → {after:.0f} at {wait:g} s; server closed {closed:g}"

    # item 11
    def utf8_token(self) -> str:
        out = []
        for encoding in ("utf-8", "latin-1"):
            value = f"Bearer {UTF8_TOKEN}".encode(encoding)
            status = self.post("/v1/embeddings", b'{"input": "hi"}', {"authorization": value})
            out.append(f"{encoding} {status[:3]}")
        return "; ".join(out)

    # item 12
    def gzip_members(self) -> str:
        body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a b"]}]}).encode()
        path, headers = f"/v2/models/{self.models['embedding']}/infer", {"content-encoding": "gzip"}
        two = gzip.compress(body[:20]) + gzip.compress(body[20:])
        trailing = gzip.compress(body) + b"trailing bytes"
        return f"two members {self.post(path, two, headers)[:3]}; bytes after {self.post(path, trailing, headers)[:3]}"


def _closed(server: ServiceProcess, reason: str) -> float:
    """ts_http_connections_closed_total{reason} of a server started with metrics."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ts_http_connections_closed_total" and sample.labels["reason"] == reason:
                return sample.value
    return 0.0


def _compact(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


NAMES = [
    "kserve_shape_rest",
    "kserve_shape_grpc",
    "many_prompts",
    "many_token_ids",
    "nested_embeddings",
    "detokenize_many",
    "translate_many",
    "fill_mask_many",
    "kserve_raw_many",
    "kserve_decoding",
    "utf8_token",
    "gzip_members",
    "unread_answers",
    "emfile",
]


def run(probes: Probes, health: Health, names: list[str]) -> list[dict]:
    rows, pid = [], probes.server.proc.pid
    for name in names:
        rss0, cpu0, logged0, t0 = rss_mb(pid), cpu_seconds(pid), len(probes.server.log), time.perf_counter()
        try:
            status = getattr(probes, name)()
        except Exception as e:
            status = f"probe failed: {type(e).__name__}: {e}"[:100]
        t1 = time.perf_counter()
        bad = re.search(r"(^|[ :;])5\d\d\b|INTERNAL|UNKNOWN|probe failed", status)
        rows.append(
            {
                "probe": name,
                "status": ("BAD " if bad else "") + status,
                "seconds": round(t1 - t0, 2),
                "cpu_s": round(cpu_seconds(pid) - cpu0, 2),
                "worst_health_ms": round(health.worst(t0, t1) * 1e3, 1),
                "rss_mib": f"{rss0:.0f} → {rss_mb(pid):.0f}",
                "errors_logged": errors_logged(probes.server.log[logged0:]),
            }
        )
        print("| " + " | ".join(str(v) for v in rows[-1].values()) + " |", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_input", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="folder of model directories (every kind)")
    parser.add_argument("--only", default="", help="comma-separated probe names (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    parser.add_argument("--log", type=Path, help="write the server's log here")
    args = parser.parse_args(argv)
    chosen = [n for n in NAMES if not args.only or n in args.only.split(",")]
    before = conditions()
    os.environ["TS_AUTH_TOKENS"] = f"{TOKEN},{UTF8_TOKEN}"
    server = ServiceProcess(args.models, [], metrics=True, keep_log=True)
    health = Health(server.http_url, server.address)
    health.start()
    try:
        rows = run(Probes(server, args.models, args.timeout), health, chosen)
    finally:
        health.stopping = True
        server.stop()
        if args.log:
            args.log.write_text("\n".join(server.log) + "\n")
    print("| probe | status | s | server CPU s | worst health ms | RSS MiB | errors logged |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(v) for v in r.values()) + " |")
    print(json.dumps({"probes": rows, "conditions": before}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
