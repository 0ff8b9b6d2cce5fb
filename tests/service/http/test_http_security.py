"""TLS and bearer tokens on the HTTP door: the same settings and tokens as gRPC (real certificates
from deploy/scripts/make-dev-certs.sh, a real server on 127.0.0.1:0, the real openai SDK)."""

from __future__ import annotations

import asyncio
import ssl

import httpx2 as httpx  # the HTTP client the openai SDK itself depends on
import openai
import pytest

from tests.fixtures.server import metric
from tests.service.test_service_security import OTHER, SECRET_WRONG, TOKEN, certs  # noqa: F401 - a fixture

BODY = {"input": ["over https"]}


def http_failures(reason: str) -> float:
    return metric("ts_auth_failures_total", {"protocol": "http", "reason": reason})


async def test_tokens_guard_every_route_but_health(start_server, embed_models_root):
    running = await start_server(embed_models_root, auth_tokens=f"{TOKEN},{OTHER}")
    before = http_failures("missing"), http_failures("invalid")
    async with httpx.AsyncClient(base_url=running.http_url, timeout=30) as http:
        assert (await http.get("/health")).status_code == 200
        missing = await http.post("/v1/embeddings", json=BODY)
        wrong = await http.get("/v1/models", headers={"authorization": f"Bearer {SECRET_WRONG}"})
        for refused in (missing, wrong):
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["type"] == "authentication_error"
            assert SECRET_WRONG not in refused.text
        ok = await http.post("/v1/embeddings", json=BODY, headers={"authorization": f"Bearer {OTHER}"})
        assert ok.status_code == 200 and len(ok.json()["data"]) == 1
    assert (http_failures("missing"), http_failures("invalid")) == (before[0] + 1, before[1] + 1)
    sdk = openai.AsyncOpenAI(base_url=f"{running.http_url}/v1", api_key=SECRET_WRONG, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await sdk.embeddings.create(model="tiny-embed", input=["hi"])
    sdk = openai.AsyncOpenAI(base_url=f"{running.http_url}/v1", api_key=TOKEN, max_retries=0)
    assert len((await sdk.embeddings.create(model="tiny-embed", input=["hi"])).data) == 1


async def test_tls_and_mtls(start_server, embed_models_root, certs):  # noqa: F811 - the fixture
    running = await start_server(
        embed_models_root,
        tls_cert=str(certs / "server.pem"),
        tls_key=str(certs / "server.key"),
        tls_client_ca=str(certs / "ca.pem"),
        auth_tokens=TOKEN,
    )
    url = f"https://127.0.0.1:{running.server.http.port}"
    trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    with_cert = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    with_cert.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, verify=with_cert, timeout=30) as http:
        assert (await http.post("/v1/embeddings", json=BODY, headers=headers)).status_code == 200
    async with httpx.AsyncClient(base_url=url, verify=trusted, timeout=30) as no_cert:  # mTLS: refused
        with pytest.raises((httpx.HTTPError, ssl.SSLError, OSError)):
            await no_cert.post("/v1/embeddings", json=BODY, headers=headers)
    plain = f"http://127.0.0.1:{running.server.http.port}"
    async with httpx.AsyncClient(base_url=plain, timeout=5) as plaintext:  # plaintext to a TLS port
        with pytest.raises(httpx.HTTPError):
            await asyncio.wait_for(plaintext.get("/health"), 10)
