"""Hostile clients of the HTTP door (issue 33) against a real server on 127.0.0.1: bearer tokens
sent as UTF-8, 15 MB bodies of millions of small elements (refused on their count before any
per-element work, health answering meanwhile), clients that never read their answer (closed after
the write timeout), and the listener at the file-descriptor limit (no traceback per accept).
bench/hostile_input.py runs the same probes against a server process and prints their figures."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request

import grpc
import httpx2 as httpx  # the HTTP client the openai SDK itself depends on
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import ServiceProcess
from tests.fixtures.server import metric, until

UTF8_TOKEN = "tökén-ünïcode-1"


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
        reply = await asyncio.to_thread(lambda: urllib.request.urlopen(server.http_url + "/health", timeout=30))
        assert reply.status == 200
        await until(lambda: any("accepting connections" in line for line in server.log), what="accepting again")
    finally:
        await asyncio.to_thread(server.stop)
    assert not [line for line in server.log if "Traceback" in line or " ERROR " in line]
    assert sum("out of file descriptors" in line for line in server.log) == 1


async def test_answers_a_client_never_reads_are_dropped_after_the_write_timeout(start_server):
    running = await start_server(http_write_timeout_s=1.0)
    body = json.dumps({"prompt": "hello " * 100_000, "return_token_strs": True}).encode()  # a ~6 MB answer
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
