"""The sync client and the CLI `python -m client` against a real server."""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import pytest

from client import Client
from tests.paths import ROOT


async def cli(address: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client",
        "--address",
        address,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def test_cli_embed_models_health(server):
    rc, out, _ = await cli(server.address, "embed", "hello", "world", "--dimensions", "4")
    response = json.loads(out)
    assert rc == 0 and len(response["embeddings"]) == 2 and len(response["embeddings"][0]["values"]) == 4
    rc, out, _ = await cli(server.address, "models")
    assert rc == 0 and {"tiny-embed", "tiny-gpt", "tiny-translate"} <= {m["name"] for m in json.loads(out)}
    rc, out, _ = await cli(server.address, "models", "tiny-embed")
    assert rc == 0 and json.loads(out)["kind"] == "embedding"
    rc, out, _ = await cli(server.address, "health", "--service", "inference.v1.EmbeddingService")
    assert rc == 0 and json.loads(out)["status"] == "SERVING"


async def test_cli_reports_status_on_error(server):
    rc, _, err = await cli(server.address, "embed", "x", "--model", "missing")
    assert rc == 2 and "NOT_FOUND" in err and "unknown model 'missing'" in err


async def test_cli_bad_arguments_are_one_line_errors(server):
    for args, expected in [
        (("generate", "hi", "--max-new-tokens", "-1"), "argument --max-new-tokens: -1 is out of range"),
        (("generate", "hi", "--seed", "x"), "argument --seed: 'x' is not an integer"),
        (("attention", "x", "--layers", "0,a", "--json"), "argument --layers: '0,a'"),
        (("--timeout", "0", "health"), "argument --timeout: 0.0 is out of range"),
        (("--tls-ca", "/nonexistent/ca.pem", "models"), "/nonexistent/ca.pem"),
    ]:
        rc, out, err = await cli(server.address, *args)
        assert (rc, out, err.count("\n")) == (2, "", 1) and expected in err, (args, err)
    # a value the contract carries but the server refuses: its INVALID_ARGUMENT, as one line
    rc, out, err = await cli(server.address, "generate", "hi", "--model", "tiny-gpt", "--temperature", "-1")
    assert (rc, out, err.count("\n")) == (2, "", 1) and err.startswith("error: INVALID_ARGUMENT: "), err
    assert "temperature" in err


async def test_sync_client(server):
    def calls() -> None:
        with Client(server.address, timeout=30) as client:
            assert len(client.embed(["a", "b"])) == 2
            assert client.model("tiny-embed").kind == "embedding"
            assert client.health() == "SERVING"
            with pytest.raises(grpc.RpcError) as err:
                client.embed([])
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    await asyncio.to_thread(calls)
