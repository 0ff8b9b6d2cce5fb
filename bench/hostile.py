"""Hostile input at the doors: probes against a real server, one table.

    python -m export tiny --out /tmp/tiny-models
    python -m bench.hostile --models /tmp/tiny-models [--only deep_json,big_prompt_http]

Starts `python -m service` (a bearer token, metrics on) and runs each probe while a thread checks
HTTP and gRPC health every 50 ms. Per probe: what the server answered, the worst health latency,
the server's RSS before and after, and the ERROR lines and tracebacks it logged. Manifest probes
start their own server over a doctored model directory. The last line of stdout is a JSON summary.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from bench.common import ServiceProcess, ServiceStartError, conditions
from bench.procstat import rss_mb
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

TOKEN = "hostile-bench-token"
BIG = "hello " * 2621440  # 15 MiB, under the 16 MiB message limit
DEEP = b"[" * 100000 + b"]" * 100000
POST_ROUTES = ("/v1/embeddings", "/v1/completions", "/v1/translate", "/v1/fill-mask")


class Health(threading.Thread):
    """Calls both doors' health every 50 ms; `worst(t0, t1)` is the slowest call overlapping [t0, t1]."""

    def __init__(self, http_url: str, address: str):
        super().__init__(daemon=True)
        self.http_url, self.stub = http_url, health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
        self.calls: list[tuple[float, float]] = []
        self.failed = 0
        self.stopping = False

    def run(self) -> None:
        while not self.stopping:
            for call in (self._http, self._grpc):
                start = time.perf_counter()
                try:
                    call()
                except Exception:
                    self.failed += 1
                self.calls.append((start, time.perf_counter()))
            time.sleep(0.05)

    def _http(self) -> None:
        urllib.request.urlopen(self.http_url + "/health", timeout=60).read()

    def _grpc(self) -> None:
        self.stub.Check(health_pb2.HealthCheckRequest(), timeout=60)

    def worst(self, t0: float, t1: float) -> float:
        deadline = time.perf_counter() + 60
        while not any(start > t1 for start, _ in self.calls[-4:]) and time.perf_counter() < deadline:
            time.sleep(0.01)  # the check in flight at t1 has ended
        return max((end - start for start, end in self.calls if end >= t0 and start <= t1), default=0.0)


class Probes:
    def __init__(self, server: ServiceProcess, timeout: float):
        self.server, self.timeout = server, timeout
        host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(server.address, options=options)
        self.auth = (("authorization", f"Bearer {TOKEN}"),)

    def post(self, path: str, body: bytes, headers: list[tuple[str, str]] | None = None) -> str:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.putrequest("POST", path)
            for name, value in headers or [("authorization", f"Bearer {TOKEN}")]:
                conn.putheader(name, value)
            conn.putheader("content-type", "application/json")
            conn.putheader("content-length", str(len(body)))
            conn.endheaders(body)
            reply = conn.getresponse()
            text = reply.read().decode("utf-8", "replace")
        finally:
            conn.close()
        try:
            error = json.loads(text).get("error", {})
        except ValueError:
            error = {"message": text}
        return f"{reply.status} {error.get('message', '')[:70]}".strip()

    def grpc_call(self, call, request) -> str:
        try:
            call(request, timeout=self.timeout, metadata=self.auth)
            return "OK"
        except grpc.RpcError as e:
            return f"{e.code().name}: {(e.details() or '')[:70]}"

    def deep_json(self) -> str:
        return "; ".join(f"{path.rsplit('/', 1)[1]} {self.post(path, DEEP)[:3]}" for path in POST_ROUTES)

    def big_prompt_http(self) -> str:
        return self.post("/v1/completions", json.dumps({"prompt": BIG, "max_tokens": 4}).encode())

    def big_prompt_grpc(self) -> str:
        stub = pb_grpc.GenerationServiceStub(self.channel)
        return self.grpc_call(stub.Generate, pb.GenerateRequest(prompt=BIG, max_new_tokens=4))

    def big_translate_grpc(self) -> str:
        stub = pb_grpc.TranslationServiceStub(self.channel)
        return self.grpc_call(stub.Translate, pb.TranslateRequest(inputs=[BIG], max_length=4))

    def big_embed_grpc(self) -> str:
        stub = pb_grpc.EmbeddingServiceStub(self.channel)
        return self.grpc_call(stub.Embed, pb.EmbedRequest(inputs=[BIG]))

    def cut_body(self) -> str:
        before = self._http_codes()
        with socket.create_connection((self.host, self.port), timeout=self.timeout) as sock:
            sock.sendall(
                f"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n"
                'content-type: application/json\r\ncontent-length: 1000\r\n\r\n{"input"'.encode()
            )
        time.sleep(1.0)
        after = self._http_codes()
        return "counted " + (
            ", ".join(f"{k} +{after[k] - before.get(k, 0):g}" for k in after if after[k] != before.get(k, 0))
            or "nothing"
        )

    def _http_codes(self) -> dict[str, float]:
        text = urllib.request.urlopen(self.server.metrics_url, timeout=10).read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "ts_requests_total" and s.labels.get("protocol") == "http":
                    out[s.labels["code"]] = out.get(s.labels["code"], 0) + s.value
        return out

    def slow_headers(self, connections: int = 200, wait: float = 15.0) -> str:
        socks = []
        for _ in range(connections):
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\n")  # never finished
            socks.append(sock)
        time.sleep(wait)
        still = sum(_open(s) for s in socks)
        for s in socks:
            s.close()
        return f"{still}/{connections} still open after {wait:g} s"

    def bad_protobuf(self) -> str:
        embed = self.channel.unary_unary("/inference.v1.EmbeddingService/Embed")  # raw bytes both ways
        return self.grpc_call(embed, bytes.fromhex("0a046162fffe"))

    def tiny_floats(self) -> str:
        out = []
        for name, value in (("temperature", 1e-50), ("repetition_penalty", 1e-300)):
            body = json.dumps({"prompt": "Hello", "max_tokens": 4, name: value}).encode()
            out.append(f"{name} {self.post('/v1/completions', body)[:3]}")
        return "; ".join(out)

    def two_auth(self) -> str:
        good, bad = f"Bearer {TOKEN}", "Bearer wrong"
        http_status = self.post("/v1/embeddings", b'{"input": "hi"}', [("authorization", good), ("authorization", bad)])
        stub = pb_grpc.ModelServiceStub(self.channel)
        try:
            stub.ListModels(
                pb.ListModelsRequest(), timeout=self.timeout, metadata=(("authorization", good), ("authorization", bad))
            )
            grpc_status = "OK"
        except grpc.RpcError as e:
            grpc_status = e.code().name
        return f"HTTP {http_status[:3]}, gRPC {grpc_status}"


def _open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def manifest_probes(models: Path, timeout: float) -> dict[str, str]:
    """A server over a doctored copy of the generation model: did it start, or why not."""
    source = next(
        p
        for p in sorted(models.iterdir())
        if (p / "model.json").is_file() and json.loads((p / "model.json").read_text())["kind"] == "generation"
    )
    other = next(p for p in sorted(models.iterdir()) if (p / "model.json").is_file() and p != source)
    passwd = Path("/etc/passwd")
    cases = {
        "tokenizer ../../etc/passwd": lambda d: _tokenizer(d, "../" * 8 + "etc/passwd", passwd),
        "tokenizer absolute, another model's": lambda d: _tokenizer(
            d, str(other / "tokenizer.json"), other / "tokenizer.json"
        ),
        "corrupt graph, --no-verify-hashes": _corrupt_graph,
    }
    out = {}
    for name, doctor in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(shutil.copytree(source, Path(tmp) / source.name))
            doctor(copy)
            out[name] = _start_once(Path(tmp), ["--no-verify-hashes"] if "verify" in name else [], timeout)
    return out


def _tokenizer(model_dir: Path, file: str, real: Path) -> None:
    manifest = json.loads((model_dir / "model.json").read_text())
    manifest["tokenizer"].update(file=file, sha256=hashlib.sha256(real.read_bytes()).hexdigest())
    (model_dir / "model.json").write_text(json.dumps(manifest))


def _corrupt_graph(model_dir: Path) -> None:
    for graph in json.loads((model_dir / "model.json").read_text())["graphs"]:
        path = model_dir / graph["file"]
        data = bytearray(path.read_bytes())
        data[: min(len(data), 4096)] = bytes(range(256)) * 16  # invalid UTF-8 and protobuf at the start
        path.write_bytes(bytes(data))


def _start_once(models: Path, flags: list[str], timeout: float) -> str:
    try:
        ServiceProcess(models, flags, http=False, exit_timeout=timeout).stop()
        return "SERVED (started)"
    except ServiceStartError as e:
        lines, code = e.log, e.returncode
    traceback = any(line.startswith("Traceback") for line in lines)
    last = next((line for line in reversed(lines) if line.strip()), "")
    reason = last.split("cannot start: ", 1)[1] if "cannot start: " in last else last
    return f"refused (exit {code}{', traceback' if traceback else ''}): {reason[:160]}"


def errors_logged(lines: list[str]) -> int:
    return sum(1 for line in lines if " ERROR " in line or line.startswith("Traceback"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="folder of model directories (the tiny ones)")
    parser.add_argument("--only", default="", help="comma-separated probe names (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds without calls before the last RSS")
    args = parser.parse_args(argv)
    names = [
        "deep_json",
        "big_prompt_http",
        "big_prompt_grpc",
        "big_translate_grpc",
        "big_embed_grpc",
        "cut_body",
        "slow_headers",
        "bad_protobuf",
        "tiny_floats",
        "two_auth",
    ]
    chosen = [n for n in names if not args.only or n in args.only.split(",")]
    before = conditions()
    os.environ["TS_AUTH_TOKENS"] = TOKEN
    server = ServiceProcess(args.models, [], metrics=True, keep_log=True)
    rows, health = [], Health(server.http_url, server.address)
    health.start()
    try:
        probes = Probes(server, args.timeout)
        start_rss = rss_mb(server.proc.pid)
        for name in chosen:
            rss0, logged0, t0 = rss_mb(server.proc.pid), len(server.log), time.perf_counter()
            try:
                status = getattr(probes, name)()
            except Exception as e:
                status = f"probe failed: {type(e).__name__}: {e}"[:100]
            t1 = time.perf_counter()
            worst = health.worst(t0, t1)
            rows.append(
                {
                    "probe": name,
                    "status": status,
                    "seconds": round(t1 - t0, 2),
                    "worst_health_ms": round(worst * 1e3, 1),
                    "rss_before_mib": round(rss0),
                    "rss_after_mib": round(rss_mb(server.proc.pid)),
                    "errors_logged": errors_logged(server.log[logged0:]),
                }
            )
            print(_row(rows[-1]), file=sys.stderr, flush=True)
        time.sleep(args.idle)
        idle_rss = rss_mb(server.proc.pid)
    finally:
        health.stopping = True
        server.stop()
    manifests = manifest_probes(args.models, args.timeout) if not args.only or "manifest" in args.only else {}
    _table(rows, manifests, start_rss, idle_rss, args.idle)
    print(
        json.dumps(
            {
                "probes": rows,
                "manifests": manifests,
                "rss_start_mib": round(start_rss),
                "rss_after_idle_mib": round(idle_rss),
                "idle_s": args.idle,
                "conditions": before,
            }
        )
    )
    return 0


def _row(r: dict) -> str:
    return (
        f"| {r['probe']} | {r['status']} | {r['seconds']} | {r['worst_health_ms']} | "
        f"{r['rss_before_mib']} → {r['rss_after_mib']} | {r['errors_logged']} |"
    )


def _table(rows: list[dict], manifests: dict[str, str], start: float, idle: float, idle_s: float) -> None:
    print("| probe | status | s | worst health ms | RSS MiB | errors logged |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(_row(r))
    print(f"\nRSS {start:.0f} MiB at the start, {idle:.0f} MiB after {idle_s:g} s idle at the end.\n")
    for name, outcome in manifests.items():
        print(f"- manifest, {name}: {outcome}")


if __name__ == "__main__":
    sys.exit(main())
