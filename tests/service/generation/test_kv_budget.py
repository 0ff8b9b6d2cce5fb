"""The generation KV-cache budget and context cap (service/generation/kvbudget.py) on real servers over tiny-gpt.

tiny-gpt's cache row: 2 layers x key and value x 4 heads x 160 positions x 8 x float32 = 81,920 bytes.
- a budget of 3 rows serves 3 rows instead of gen_max_batch (a WARNING, ModelInfo says so) and
  more concurrent generations than rows still all finish;
- a budget under one row refuses the model: the server does not start and says why and what to change;
- gen_max_context caps the context: longer prompts are INVALID_ARGUMENT, outputs are capped to fit.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest

from client import generate_request
from service.generation.kvbudget import cpu_free_bytes
from service.proto import inference_pb2 as pb
from service.registry import ModelLoadError
from service.server import run
from tests.fixtures.server import server_settings

ROW = 2 * 2 * 4 * 160 * 8 * 4


@pytest.fixture(scope="module")
def gpt_root(tiny_models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpt-models")
    (root / "tiny-gpt").symlink_to(Path(tiny_models_root) / "tiny-gpt", target_is_directory=True)
    return root


async def info(server) -> pb.ModelInfo:
    return await server.models.GetModel(pb.GetModelRequest(name="tiny-gpt"))


async def test_default_budget_serves_every_row_and_says_so(start_server, gpt_root, caplog):
    caplog.set_level(logging.INFO, logger="service.generation.kvbudget")
    server = await start_server(gpt_root, gen_max_batch=4)
    got = await info(server)
    assert got.manifest["serving.kv_rows"] == "4" and got.manifest["serving.context"] == "160"
    assert got.manifest["serving.kv_cache_bytes"] == str(4 * ROW)
    assert "KV cache 4 rows x 160 positions x 2 layers x 4 heads x 8 = 0.3 MiB (float32" in caplog.text
    assert "auto: 50% of" in caplog.text


async def test_a_short_budget_serves_fewer_rows(start_server, gpt_root, caplog):
    caplog.set_level(logging.INFO, logger="service.generation.kvbudget")
    server = await start_server(gpt_root, gen_max_batch=16, gen_kv_cache_bytes=3 * ROW + 100)
    got = await info(server)
    assert got.manifest["serving.kv_rows"] == "3" and got.manifest["serving.kv_cache_bytes"] == str(3 * ROW)
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "service.generation.kvbudget" and "tiny-gpt" in r.getMessage()
    ]
    assert warned and "serving 3 rows instead" in warned[0]
    assert "gen_kv_cache_bytes" in warned[0]
    calls = [server.generation.Generate(generate_request(f"Once upon a time {i}", max_new_tokens=12)) for i in range(7)]
    replies = await asyncio.gather(*calls)
    assert all(r.token_ids and r.finish_reason != pb.FINISH_REASON_UNSPECIFIED for r in replies)


async def test_a_budget_under_one_row_refuses_the_model(start_server, gpt_root):
    with pytest.raises(ModelLoadError) as caught:
        await start_server(gpt_root, gen_kv_cache_bytes=ROW - 1)
    message = str(caught.value)
    for part in (
        "'tiny-gpt'",
        f"{ROW} bytes",
        f"{ROW - 1} bytes",
        "160 positions",
        "gen_kv_cache_bytes",
        "gen_max_context",
        "at most 159 positions fits",
    ):
        assert part in message, (part, message)
    server = await start_server(gpt_root, gen_kv_cache_bytes=ROW - 1, gen_max_context=159)  # what it says fits
    assert (await info(server)).manifest["serving.kv_rows"] == "1"


def test_the_server_does_not_start_and_logs_why(gpt_root, caplog):
    settings = server_settings(gpt_root, gen_kv_cache_bytes=1000)
    assert run(settings) == 1
    assert "cannot start: generation model 'tiny-gpt': one KV-cache row" in caplog.text


async def test_max_context_caps_prompts_and_outputs(start_server, gpt_root):
    server = await start_server(gpt_root, gen_max_context=12)
    got = await info(server)
    assert got.manifest["serving.context"] == "12" and got.max_input_tokens == 11 and got.max_output_tokens == 11
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.generation.Generate(generate_request("Once upon a time there was a cat " * 3))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 11 prompt tokens" in caught.value.details() and "gen_max_context" in caught.value.details()
    reply = await server.generation.Generate(generate_request("Hi", max_new_tokens=1000))
    assert reply.usage.input_tokens + len(reply.token_ids) <= 12
    chunks = [c async for c in server.generation.GenerateStream(generate_request("Hi", max_new_tokens=1000))]
    assert sum(len(c.token_ids) for c in chunks) == len(reply.token_ids)


def test_available_memory_reads_meminfo_and_the_cgroup(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  8000000 kB\nMemAvailable:  4000000 kB\n")
    assert cpu_free_bytes(meminfo, tmp_path / "no-cgroup") == 4_000_000 * 1024
    (tmp_path / "memory.max").write_text("3000000000\n")
    (tmp_path / "memory.current").write_text("1000000000\n")
    assert cpu_free_bytes(meminfo, tmp_path) == 2_000_000_000
    (tmp_path / "memory.max").write_text("max\n")
    assert cpu_free_bytes(meminfo, tmp_path) == 4_000_000 * 1024
