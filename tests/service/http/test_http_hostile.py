"""Hostile clients of the HTTP door (issue 33) against a real server on 127.0.0.1: bearer tokens
sent as UTF-8, 15 MB bodies of millions of small elements (refused on their count before any
per-element work, health answering meanwhile), clients that never read their answer (closed after
the write timeout), and the listener at the file-descriptor limit (no traceback per accept).
bench/hostile_input.py runs the same probes against a server process and prints their figures."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import grpc
import httpx2 as httpx  # the HTTP client the openai SDK itself depends on
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import ServiceProcess
from service.http.body import MAX_JSON_VALUES
from tests.fixtures.server import metric, until

UTF8_TOKEN = "tökén-ünïcode-1"


def no_errors_logged(caplog) -> None:
    bad = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


async def test_a_non_ascii_token_sent_as_utf8_is_accepted(start_server, embed_models_root):
    running = await start_server(embed_models_root, auth_tokens=f"ascii-token,{UTF8_TOKEN}")
    invalid = metric("ts_auth_failures_total", {"protocol": "http", "reason": "invalid"})
    async with httpx.AsyncClient(base_url=running.http_url, timeout=30) as http:
        utf8 = await http.post(
            "/v1/embeddings", json={"input": "hi"}, headers={"authorization": f"Bearer {UTF8_TOKEN}".encode()}
        )
        assert utf8.status_code == 200, utf8.text
        latin1 = await http.post(  # other bytes: another token
            "/v1/embeddings", json={"input": "hi"}, headers={"authorization": f"Bearer {UTF8_TOKEN}".encode("latin-1")}
        )
        assert latin1.status_code == 401
    assert metric("ts_auth_failures_total", {"protocol": "http", "reason": "invalid"}) == invalid + 1


def answer(sock: socket.socket) -> bytes | None:
    """What the server sent on a non-blocking socket (b"" closed with nothing), None: nothing yet."""
    try:
        return sock.recv(1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


async def test_at_the_descriptor_limit_connections_get_503_without_a_traceback_per_accept(embed_models_root):
    server = await asyncio.to_thread(ServiceProcess, embed_models_root, [], keep_log=True, max_files=128)
    try:
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(server.address))
        health.Check(health_pb2.HealthCheckRequest(), timeout=30)  # connected before the limit is reached
        port = int(server.http_url.rsplit(":", 1)[1])
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
        for sock in socks:
            sock.setblocking(False)
        replies: dict[int, bytes] = {}

        def refused() -> list[bytes]:
            for i, sock in enumerate(socks):
                if i not in replies and (reply := answer(sock)) is not None:
                    replies[i] = reply
            return [r for r in replies.values() if r]

        await until(lambda: bool(refused()), what="a refused connection")
        assert all(r.startswith(b"HTTP/1.1 503") and b"out of file descriptors" in r for r in refused())
        assert (
            health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == health_pb2.HealthCheckResponse.SERVING
        )
        for sock in socks:
            sock.close()
        # The server frees a descriptor when it sees its client's close: until then an accept can
        # meet the limit again (a new episode, one more warning), so health is polled, not asked once.
        await until(lambda: _health(server.http_url) == 200, timeout=30, what="HTTP /health 200 after the closes")
        await until(lambda: any("accepting connections" in line for line in server.log), what="accepting again")
    finally:
        await asyncio.to_thread(server.stop)
    assert not [line for line in server.log if "Traceback" in line or " ERROR " in line]
    # One warning per episode, not one per accept try (the flood was ~12,000 lines a second).
    assert 1 <= sum("out of file descriptors" in line for line in server.log) <= 5


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as reply:
            return reply.status
    except (urllib.error.URLError, OSError):
        return 0


async def test_answers_a_client_never_reads_are_dropped_after_the_write_timeout(start_server):
    running = await start_server(http_write_timeout_s=1.0)
    body = json.dumps({"prompt": "hello " * 170_000, "return_token_strs": True}).encode()  # ~10 MB: over kernel buffers
    request = (
        f"POST /tokenize HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    closed = metric("ts_http_connections_closed_total", {"reason": "write_timeout"})
    socks = []
    for _ in range(4):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer stays in the server's buffers
        sock.connect(("127.0.0.1", running.server.http.port))
        sock.sendall(request)
        socks.append(sock)
    await until(
        lambda: metric("ts_http_connections_closed_total", {"reason": "write_timeout"}) == closed + 4,
        timeout=60,
        what="the unread answers dropped",
    )
    for sock in socks:
        sock.close()
    async with httpx.AsyncClient(base_url=running.http_url, timeout=60) as http:  # a client that reads: served
        reply = await http.post("/tokenize", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 200 and reply.json()["count"] > 100_000
    assert metric("ts_http_connections_closed_total", {"reason": "write_timeout"}) == closed + 4


MANY = 3_750_000  # small elements in a 15 MB body


def compact(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def test_bodies_of_millions_of_values_are_refused_before_they_are_parsed(server, caplog):
    nested = b'{"input": ' + b"[" * 29 + b"[]," * (5_000_000 - 1) + b"[]" + b"]" * 29 + b"}"  # 30 deep: allowed
    bodies = {
        "/v1/completions": compact({"prompt": ["a"] * MANY}),
        "/v1/embeddings": nested,
        "/detokenize": compact({"tokens": [1] * 2 * MANY}),
        "/v1/translate": compact({"inputs": ["a"] * MANY}),
        "/v1/fill-mask": compact({"inputs": ["a"] * MANY}),
        "/v2/models/tiny-embed/infer": compact({"inputs": [{"name": "text", "shape": [MANY], "data": ["a"] * MANY}]}),
    }
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
        for route, body in bodies.items():
            reply = await http.post(route, content=body, headers={"content-type": "application/json"})
            assert reply.status_code == 400 and f"over {MAX_JSON_VALUES} values" in reply.text, (route, reply.text)
    no_errors_logged(caplog)


async def test_arrays_are_counted_before_their_elements_are_looked_at(server, caplog):
    over = ["a"] * 300 + [None]  # the element that is wrong comes after the count that is
    cases = {
        "/v1/completions": ({"prompt": over}, "prompt holds 301 elements; one call takes at most 256 (gen_max_queue)"),
        "/v1/embeddings": ({"input": over}, "input holds 301 elements; one call takes at most 256 (embed_max_inputs)"),
        "/v1/translate": ({"inputs": over}, "inputs holds 301 elements; one call takes at most 256 (translate_max_"),
        "/v1/fill-mask": ({"inputs": over}, "inputs holds 301 elements; one call takes at most 256 (embed_max_inputs)"),
    }
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
        for route, (body, message) in cases.items():
            reply = await http.post(route, json=body)
            assert reply.status_code == 400 and message in reply.json()["error"]["message"], (route, reply.text)
        ids = [1] * 999_999 + ["x"]  # a token-id prompt: its length is the model's first check
        reply = await http.post("/v1/completions", json={"prompt": ids, "max_tokens": 1})
        assert reply.status_code == 400 and "prompt is 1000000 tokens; model 'tiny-gpt' accepts at most" in reply.text
        reply = await http.post("/v1/completions", json={"prompt": [[1, 2], [3, True]], "max_tokens": 1})
        assert reply.status_code == 400 and "prompt[1][1]='True' is not a token id" in reply.text
        for tokens, message in (
            ([1] * 99_999 + ["x"], "tokens[99999]="),
            ([1] * 99_999 + [10**9], "tokens[99999]=1000000000"),
        ):
            reply = await http.post("/detokenize", json={"tokens": tokens})  # checked in a thread
            assert reply.status_code == 400 and message in reply.text, reply.text
        reply = await http.post("/detokenize", json={"tokens": [1] * 1_000_000})
        assert reply.status_code == 200 and len(reply.json()["prompt"]) >= 1_000_000
    no_errors_logged(caplog)
