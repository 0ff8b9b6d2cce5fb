"""Hostile input at both doors (issue 24), each finding against a real server on 127.0.0.1 (tiny models):
no 500, no UNKNOWN, no traceback, no stall, no file outside the model directory. bench/hostile.py
runs the same probes against a server process and prints their figures."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import httpx2 as httpx  # the HTTP client the openai SDK itself depends on
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import ServiceProcess
from bench.procstat import rss_mb
from service.http.body import MAX_JSON_DEPTH
from service.manifest import ModelDirError
from service.proto import inference_pb2 as pb
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from service.proto.inference_pb2_grpc import EmbeddingServiceStub
from tests.fixtures.models import copy_model_dir
from tests.fixtures.server import metric, until

BIG = "hello " * 2621440  # 15 MiB: under the 16 MiB message limit
DEEP = b"[" * 100000 + b"]" * 100000
ROUTES = ("/v1/embeddings", "/v1/completions", "/v1/translate", "/v1/fill-mask")
TOKEN = "hostile-token-0123"


def no_errors_logged(caplog) -> None:
    bad = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


def requests_total(code: str, service: str, method: str, protocol: str) -> float:
    labels = {"service": service, "method": method, "model": "-", "code": code, "protocol": protocol}
    return metric("ts_requests_total", labels)


async def test_deeply_nested_json_is_400_naming_the_limit_on_every_route(server, caplog):
    parsable = {"input": json.loads("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        for route in ROUTES:
            for body in (DEEP, json.dumps(parsable).encode()):  # Python's parser gives up / the check after it
                reply = await http.post(route, content=body, headers={"content-type": "application/json"})
                assert reply.status_code == 400, (route, reply.text)
                assert f"deeper than {MAX_JSON_DEPTH} levels" in reply.json()["error"]["message"]
        brackets_in_text = {"inputs": ["[MASK] is [[[{{{ ]]]" * 2]}  # brackets inside strings do not nest
        assert (await http.post("/v1/fill-mask", json=brackets_in_text)).status_code == 200
        assert (await http.post("/v1/embeddings", json={"input": ["[" * 500]})).status_code == 200
    no_errors_logged(caplog)


class HealthPoller(threading.Thread):
    """Both doors' health every 20 ms from another thread: the slowest call while it runs."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.url, self.stub = (
            server.http_url + "/health",
            health_pb2_grpc.HealthStub(grpc.insecure_channel(server.address)),
        )
        self.worst, self.calls, self.stopping = 0.0, 0, False

    def run(self) -> None:
        while not self.stopping:
            for check in (
                lambda: urllib.request.urlopen(self.url, timeout=120).read(),
                lambda: self.stub.Check(health_pb2.HealthCheckRequest(), timeout=120),
            ):
                start = time.perf_counter()
                check()
                self.worst = max(self.worst, time.perf_counter() - start)
                self.calls += 1
            time.sleep(0.02)


async def test_a_15_mb_input_is_refused_before_tokenizing_and_health_stays_quick(server):
    poller = HealthPoller(server)
    poller.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
            reply = await http.post("/v1/completions", json={"prompt": BIG, "max_tokens": 4})
        assert reply.status_code == 400 and "characters, more than 48 tokens can hold" in reply.text
        calls = [
            server.generation.Generate(pb.GenerateRequest(prompt=BIG, max_new_tokens=4)),
            server.translation.Translate(pb.TranslateRequest(inputs=[BIG])),
            server.embedding.Embed(pb.EmbedRequest(inputs=[BIG], truncate=False)),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"is {len(BIG)} characters, more than 48 tokens can hold" in caught.value.details()
        # A truncating embedding must tokenize its text; a 1.5 MB one does so in a thread, GIL released.
        reply = await server.embedding.Embed(pb.EmbedRequest(inputs=[BIG[: 3 << 19]]))
        assert reply.usage.input_tokens == 48
        await until(lambda: poller.calls > 10)
    finally:
        poller.stopping = True
        await asyncio.to_thread(poller.join)  # the server answers its last check meanwhile
    assert poller.worst < 5.0  # wide: a shared 2-core machine; before: 50-110 s for the 15 MB prompt


async def test_memory_goes_back_after_large_requests(embed_models_root):
    """A server process of its own: the RSS of this test process would count every other test's memory."""
    server = await asyncio.to_thread(ServiceProcess, embed_models_root, [])
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = EmbeddingServiceStub(channel)
            await stub.Embed(pb.EmbedRequest(inputs=["warm"]))
            before, peak = rss_mb(server.proc.pid), 0.0
            for _ in range(2):
                call = asyncio.ensure_future(stub.Embed(pb.EmbedRequest(inputs=[BIG[: 2 << 20]])))
                while not call.done():  # ~0.5 GB while it is tokenized
                    peak = max(peak, rss_mb(server.proc.pid))
                    await asyncio.sleep(0.05)
                assert (await call).usage.input_tokens == 48
        try:
            await until(lambda: rss_mb(server.proc.pid) < before + 64, timeout=60)  # the trimmer looks every 5 s
        except TimeoutError:
            raise AssertionError(
                f"RSS {before:.0f} MiB before, {peak:.0f} at the peak, {rss_mb(server.proc.pid):.0f} now"
            ) from None
        assert peak > before + 200, (before, peak)  # there was something to give back
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_body_cut_short_is_cancelled_without_a_traceback(server, caplog):
    cancelled = requests_total("CANCELLED", "EmbeddingService", "Embed", "http")
    internal = requests_total("INTERNAL", "EmbeddingService", "Embed", "http")
    port = server.server.http.port
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 1000\r\n\r\n{"input"'
    )
    await writer.drain()
    writer.close()
    await until(lambda: requests_total("CANCELLED", "EmbeddingService", "Embed", "http") == cancelled + 1)
    assert requests_total("INTERNAL", "EmbeddingService", "Embed", "http") == internal
    no_errors_logged(caplog)


def closed(sock: socket.socket) -> bool:
    """The server closed a non-blocking socket (it sends nothing first on a header timeout)."""
    try:
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


async def test_slow_headers_and_bodies_are_cut_off(start_server, embed_models_root):
    server = await start_server(embed_models_root, http_header_timeout_s=1.0, http_body_timeout_s=1.0)
    port, timeouts = server.server.http.port, metric("ts_http_connections_closed_total", {"reason": "header_timeout"})
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    for i, sock in enumerate(socks):
        sock.setblocking(False)
        sock.send(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\n" if i % 2 else b"")  # half send nothing at all
    await until(lambda: all(closed(s) for s in socks), timeout=15)
    assert metric("ts_http_connections_closed_total", {"reason": "header_timeout"}) == timeouts + 20
    for sock in socks:
        sock.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)  # in time, in pieces: served
    for piece in (b"GET /health HTTP/1.1\r\n", b"host: x\r\n", b"\r\n"):
        writer.write(piece)
        await asyncio.sleep(0.2)
    assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
    writer.close()
    slow = requests_total("DEADLINE_EXCEEDED", "EmbeddingService", "Embed", "http")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b'POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"input"')
    reply = await asyncio.wait_for(reader.read(), 15)  # then the server closes the connection
    assert reply.startswith(b"HTTP/1.1 408") and b"http_body_timeout_s" in reply
    assert requests_total("DEADLINE_EXCEEDED", "EmbeddingService", "Embed", "http") == slow + 1
    writer.close()


async def test_connections_beyond_the_cap_get_503(start_server, embed_models_root):
    server = await start_server(embed_models_root, http_max_connections=8)
    port = server.server.http.port
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    await asyncio.sleep(0.2)  # the server accepted them
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    reply = await asyncio.wait_for(reader.read(), 15)
    assert reply.startswith(b"HTTP/1.1 503") and b"http_max_connections" in reply
    writer.close()
    for sock in held:
        sock.close()
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        assert (await http.get("/health")).status_code == 200


async def test_undecodable_protobuf_is_invalid_argument_naming_no_class(server, caplog):
    before = requests_total("INVALID_ARGUMENT", "EmbeddingService", "Embed", "grpc")
    raw = bytes.fromhex("0a046162fffe")  # inputs[0] = 2 bytes, then stray bytes: invalid UTF-8, no field
    calls = [
        server.channel.unary_unary("/inference.v1.EmbeddingService/Embed"),
        server.channel.unary_stream("/inference.v1.GenerationService/GenerateStream"),
        server.channel.unary_unary("/grpc.health.v1.Health/Check"),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            reply = call(raw)
            if hasattr(reply, "__aiter__"):
                [m async for m in reply]
            else:
                await reply
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
        assert "is not a valid" in caught.value.details() and "Error" not in caught.value.details()

    def embed_stream() -> grpc.RpcError:  # grpc's synchronous API: grpc.aio's client can misreport (grpc#36066)
        with grpc.insecure_channel(server.address) as channel:
            stream = channel.stream_stream("/inference.v1.EmbeddingService/EmbedStream")
            try:
                list(stream(iter([pb.EmbedRequest(inputs=["fine"]).SerializeToString(), raw]), timeout=60))
            except grpc.RpcError as e:
                return e
        raise AssertionError("EmbedStream took an undecodable message")

    refused = await asyncio.to_thread(embed_stream)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "EmbedRequest" in refused.details()
    assert requests_total("INVALID_ARGUMENT", "EmbeddingService", "Embed", "grpc") == before + 1
    no_errors_logged(caplog)


TINY = [
    ("temperature", 1e-50),
    ("repetition_penalty", 1e-300),
    ("top_p", 1e-50),
    ("temperature", 1e-5),
    ("repetition_penalty", 5e-4),
]


async def test_values_in_0_to_0_001_are_refused_not_rounded_to_0(server):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        for name, value in TINY:
            reply = await http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, name: value})
            assert reply.status_code == 400 and name in reply.json()["error"]["message"], (name, value, reply.text)
        reply = await http.post("/v1/translate", json={"inputs": ["Hello"], "lengthPenalty": 1e-50})
        assert reply.status_code == 400 and "lengthPenalty" in reply.text
    with pytest.raises(grpc.aio.AioRpcError) as caught:  # a float32 can carry 1e-40 (subnormal): range refused
        await server.generation.Generate(pb.GenerateRequest(prompt="Hello", temperature=1e-40))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature must be 0" in caught.value.details()
    request = oip.ModelInferRequest(model_name="tiny-gpt")  # the Open Inference Protocol's double parameters
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"Hello")
    request.parameters["temperature"].double_param = 1e-50
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await oip_grpc.GRPCInferenceServiceStub(server.channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in caught.value.details()


def _tokenizer_entry(model_dir: Path, file: str, content_of: Path) -> None:
    manifest = json.loads((model_dir / "model.json").read_text())
    manifest["tokenizer"].update(file=file, sha256=hashlib.sha256(content_of.read_bytes()).hexdigest())
    (model_dir / "model.json").write_text(json.dumps(manifest))


async def test_every_manifest_path_stays_inside_its_directory(start_server, tiny_models_root, tmp_path):
    other = tiny_models_root / "tiny-embed" / "tokenizer.json"
    cases = {
        "passwd": lambda d: _tokenizer_entry(d, "../" * 12 + "etc/passwd", Path("/etc/passwd")),
        "absolute": lambda d: _tokenizer_entry(d, str(other.resolve()), other),
        "symlink": lambda d: ((d / "tokenizer.json").unlink(), (d / "tokenizer.json").symlink_to(other.resolve())),
    }
    for name, doctor in cases.items():
        root = tmp_path / name
        model_dir = copy_model_dir(tiny_models_root / "tiny-gpt", root)
        doctor(model_dir)
        with pytest.raises(ModelDirError) as caught:
            await start_server(root)
        message = str(caught.value)
        assert str(model_dir / "model.json") in message and "model directory" in message, message


async def test_load_errors_name_the_file(start_server, tiny_models_root, tmp_path):
    cases = {
        "*.onnx": b"\x80\x81 not a graph" * 100,
        "tokenizer.json": b"\xff\xfe not json",
        "model.json": b"\x80 not utf-8",
    }
    for pattern, garbage in cases.items():
        root = tmp_path / pattern.replace("*", "graphs")
        model_dir = copy_model_dir(tiny_models_root / "tiny-gpt", root)
        files = list(model_dir.glob(pattern))
        for file in files:
            file.write_bytes(garbage)
        with pytest.raises(ModelDirError) as caught:
            await start_server(root, verify_hashes=False)
        assert any(f"{file}: " in str(caught.value) for file in files), str(caught.value)


async def test_two_authorization_headers_are_refused_on_both_doors(start_server, embed_models_root):
    server = await start_server(embed_models_root, auth_tokens=f"{TOKEN},other-token")
    malformed = metric("ts_auth_failures_total", {"protocol": "http", "reason": "malformed"})
    good, bad = f"Bearer {TOKEN}", "Bearer wrong"
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        for pair in ((good, bad), (bad, good), (good, good)):
            reply = await http.post(
                "/v1/embeddings", json={"input": "hi"}, headers=[("authorization", pair[0]), ("authorization", pair[1])]
            )
            assert reply.status_code == 401 and "malformed" in reply.json()["error"]["message"]
        ok = await http.post("/v1/embeddings", json={"input": "hi"}, headers={"authorization": good})
        assert ok.status_code == 200
    assert metric("ts_auth_failures_total", {"protocol": "http", "reason": "malformed"}) == malformed + 3
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.embedding.Embed(
            pb.EmbedRequest(inputs=["hi"]), metadata=(("authorization", good), ("authorization", good))
        )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
