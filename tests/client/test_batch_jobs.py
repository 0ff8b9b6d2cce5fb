"""The batch embedding client against a real server: formats, per-item failures, shards, retries
on RESOURCE_EXHAUSTED and UNAVAILABLE, refusal to resume another job's work folder; plus the pure
chunk / shard arithmetic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from client.batch import cli, sources
from client.batch.embedder import BatchFailed, EmbedOptions
from client.batch.runner import JobConfig, run_job
from client.batch.store import LedgerMismatch
from service.proto import inference_pb2 as pb
from tests.fixtures.server import metric

FAST_RETRY = dict(backoff_base=0.01, backoff_max=0.05)


async def embed_one(stub, text: str) -> np.ndarray:
    return np.array((await stub.Embed(pb.EmbedRequest(inputs=[text]))).embeddings[0].values, dtype=np.float32)


def job(input: Path, output: Path, address: str, **kw) -> JobConfig:
    embed = EmbedOptions(batch_size=kw.pop("batch_size", 8), **FAST_RETRY, **kw.pop("embed", {}))
    return JobConfig(
        input=input,
        output=output,
        address=address,
        chunk_size=kw.pop("chunk_size", 20),
        concurrency=kw.pop("concurrency", 2),
        progress=False,
        embed=embed,
        **kw,
    )


def test_chunks_cover_every_item_once_across_shards():
    items = [sources.Item(i, f"t{i}") for i in range(103)]
    seen = []
    for shard in range(3):
        chunks = list(sources.iter_chunks(iter(items), 10, shard, 3))
        assert all(c.index % 3 == shard for c in chunks)
        assert sum(len(c.items) for c in chunks) == sources.shard_item_count(103, 10, shard, 3)
        seen += [it.id for c in chunks for it in c.items]
    assert sorted(seen) == list(range(103))
    skipped = list(sources.iter_chunks(iter(items), 10, 0, 1, skip=frozenset({0, 10})))
    assert [c.index for c in skipped] == list(range(1, 10))


def test_shard_output_names():
    assert cli.shard_output("out.parquet", 0, 1) == "out.parquet"
    assert cli.shard_output("d/out.npy", 2, 4) == "d/out-00002-of-00004.npy"
    assert cli.shard_output("out-{shard:03d}-{shards}.parquet", 2, 4) == "out-002-4.parquet"
    with pytest.raises(ValueError, match="shard"):
        cli.shard_output("out-{part}.parquet", 0, 2)


def test_flags_take_the_shard_from_the_indexed_job(monkeypatch, tmp_path):
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    args = cli.build_parser().parse_args([str(tmp_path / "in.txt"), "--output", "o-{shard}.npy", "--shard-count", "4"])
    cfg = cli.job_config(args)
    assert (cfg.shard_index, cfg.shard_count, cfg.output) == (3, 4, Path("o-3.npy"))
    for bad in (["--shard-count", "2"], ["--output", "o.csv"], ["--batch-size", "0"]):
        argv = [str(tmp_path / "in.txt"), "--output", "o.npy", "--shard-count", "4", *bad]
        with pytest.raises(ValueError):
            cli.job_config(cli.build_parser().parse_args(argv))
    assert cli.main([str(tmp_path / "in.txt"), "--output", "o.csv"]) == 2


def test_client_cli_dispatch_uses_the_clients_address(tmp_path):
    """`python -m client --address A batch ...`: the subcommand runs the job against A."""
    from client import Client
    from client.batch import store

    assert set(cli.DTYPE_CHOICES) == set(store.DTYPES)
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--timeout", type=float, default=30.0)
    cli.add_batch_parser(parser.add_subparsers(dest="command"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    corpus = tmp_path / "in.txt"
    corpus.write_text("hello\n")
    args = parser.parse_args(
        [
            "--address",
            closed,
            "batch",
            str(corpus),
            "--output",
            str(tmp_path / "o.parquet"),
            "--max-retries",
            "0",
            "--no-progress",
        ]
    )
    assert args.timeout == 30.0 and args.chunk_timeout == 600.0
    with Client(closed) as client:
        assert args.handler(args, client) == 1  # UNAVAILABLE at `closed`, no retries: the job fails
    assert args.address == closed


async def test_jsonl_to_npy_float16_with_failures(start_server, embed_models_root, tmp_path):
    running = await start_server(embed_models_root)
    lines = [json.dumps({"id": f"doc-{i}", "text": f"document number {i} about topic {i % 7}"}) for i in range(50)]
    lines[3] = "{not json"
    lines[10] = json.dumps({"id": "doc-10"})  # no text
    lines[20] = json.dumps({"id": "doc-20", "text": ""})  # the server refuses an empty input
    lines[21] = json.dumps({"id": 21, "text": "an integer id"})
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n\n")
    summary = await run_job(job(corpus, tmp_path / "out.npy", running.address, dtype="float16"))

    failures = [json.loads(x) for x in summary.failures_file.read_text().splitlines()]
    assert {f["id"]: f["code"] for f in failures} == {
        "line:4": "INVALID_INPUT",
        "doc-10": "INVALID_INPUT",
        "doc-20": "INVALID_ARGUMENT",
    }
    assert "empty" in next(f["message"] for f in failures if f["id"] == "doc-20")
    ids = np.load(tmp_path / "out.ids.npy")
    matrix = np.load(tmp_path / "out.npy")
    expected_ids = [f"doc-{i}" for i in range(50) if i not in (3, 10, 20, 21)]
    expected_ids.insert(18, "21")
    assert ids.tolist() == expected_ids and summary.rows == 47 and summary.failed == 3
    assert matrix.dtype == np.float16 and matrix.shape[0] == 47
    np.testing.assert_allclose(
        matrix[0].astype(np.float32), await embed_one(running.embedding, "document number 0 about topic 0"), atol=2e-3
    )


async def test_parquet_shards_split_the_work(start_server, embed_models_root, tmp_path):
    running = await start_server(embed_models_root)
    corpus = tmp_path / "corpus.parquet"
    ids = pa.array([1000 + i for i in range(70)], pa.int32())
    pq.write_table(pa.table({"key": ids, "body": [f"row {i} text" for i in range(70)]}), corpus)
    outputs = []
    for shard in range(2):
        cfg = job(
            corpus,
            tmp_path / f"out-{shard}.parquet",
            running.address,
            id_field="key",
            text_field="body",
            shard_index=shard,
            shard_count=2,
        )
        outputs.append((await run_job(cfg)).output)
    tables = [pq.read_table(o) for o in outputs]
    assert all(t.schema.field("id").type == pa.int32() for t in tables)
    got = tables[0].column("id").to_pylist() + tables[1].column("id").to_pylist()
    assert sorted(got) == list(range(1000, 1070)) and len(set(got)) == 70
    assert tables[0].column("id").to_pylist()[:20] == list(range(1000, 1020))  # chunk 0 is shard 0's
    row = np.array(tables[1].column("embedding")[0].as_py(), dtype=np.float32)
    np.testing.assert_allclose(row, await embed_one(running.embedding, "row 20 text"), atol=2e-5)


async def test_retries_when_the_server_sheds_load(start_server, embed_models_root, tmp_path):
    running = await start_server(embed_models_root, embed_max_queue=16, embed_max_inputs=16, embed_max_wait_ms=20.0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence {i} with a few words\n" for i in range(400)))
    labels = {
        "service": "EmbeddingService",
        "method": "EmbedStream",
        "model": "tiny-embed",
        "code": "RESOURCE_EXHAUSTED",
        "protocol": "grpc",
    }
    shed_before = metric("ts_requests_total", labels)
    summary = await run_job(
        job(corpus, tmp_path / "out.parquet", running.address, concurrency=4, embed={"window": 4, "max_retries": 50})
    )
    assert metric("ts_requests_total", labels) > shed_before  # the server did refuse work...
    assert summary.rows == 400 and summary.failed == 0  # ...and the client got everything done
    assert pq.read_table(summary.output).column("id").to_pylist() == list(range(400))


async def test_waits_for_a_server_that_is_not_up_yet(start_server, embed_models_root, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one\ntwo\nthree\n")
    # ~50-100 s of fast retries (backoff capped at 0.05 s): the server may take seconds to start under load
    cfg = job(corpus, tmp_path / "out.parquet", f"127.0.0.1:{port}", embed={"max_retries": 2000})
    task = asyncio.ensure_future(run_job(cfg))
    await asyncio.sleep(0.3)
    assert not task.done()  # UNAVAILABLE: retrying
    await start_server(embed_models_root, port=port)
    summary = await asyncio.wait_for(task, 60)
    assert summary.rows == 3


async def test_refuses_to_resume_another_jobs_folder(start_server, embed_models_root, tmp_path):
    running = await start_server(embed_models_root)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha\nbeta\n")
    await run_job(job(corpus, tmp_path / "out.parquet", running.address))
    with pytest.raises(LedgerMismatch, match="chunk_size"):
        await run_job(job(corpus, tmp_path / "out.parquet", running.address, chunk_size=7))
    restarted = await run_job(job(corpus, tmp_path / "out.parquet", running.address, chunk_size=7, restart=True))
    assert restarted.rows == 2


async def test_bad_options_fail_the_job_before_any_work(start_server, embed_models_root, tmp_path):
    running = await start_server(embed_models_root)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha\n")
    with pytest.raises(BatchFailed, match="NOT_FOUND"):
        await run_job(job(corpus, tmp_path / "out.parquet", running.address, embed={"model": "no-such-model"}))
    assert not (tmp_path / "out.parquet.parts").exists()
