"""Hostile clients of the HTTP door (issue 33) against a real server on 127.0.0.1: bearer tokens
sent as UTF-8, 15 MB bodies of millions of small elements (refused on their count before any
per-element work, health answering meanwhile), clients that never read their answer (closed after
the write timeout), and the listener at the file-descriptor limit (no traceback per accept).
bench/hostile_input.py runs the same probes against a server process and prints their figures."""

from __future__ import annotations

import httpx2 as httpx  # the HTTP client the openai SDK itself depends on

from tests.fixtures.server import metric

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
