"""The batch embedding client end to end against a real server: a 20k-line file, killed half way
(SIGKILL of the client process) and resumed; ids and vectors checked against single Embed calls.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from service.proto import inference_pb2 as pb
from tests.fixtures.server import metric, until

LINES = 20_000
CHUNK = 500
CHUNKS = LINES // CHUNK  # no blank lines below: every line is an item


def write_corpus(path: Path, lines: int, seed: int = 0) -> list[str]:
    """Deterministic pseudo-sentences of 3 to 24 words."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ter", "an", "so", "ve", "ri", "pu", "den", "ol", "ish"]
    texts = []
    for i in range(lines):
        words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(rng.randint(3, 24))]
        texts.append(f"{' '.join(words)} {i}")
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return texts


def ledger_chunks(ledger: Path) -> set[int]:
    if not ledger.is_file():
        return set()
    chunks = set()
    for line in ledger.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line being written right now
        if "chunk" in record:
            chunks.add(record["chunk"])
    return chunks


def stream_calls() -> float:
    labels = {
        "service": "EmbeddingService",
        "method": "EmbedStream",
        "model": "tiny-embed",
        "code": "OK",
        "protocol": "grpc",
    }
    return metric("ts_requests_total", labels)


async def single_embeddings(stub, texts: list[str]) -> np.ndarray:
    """One Embed call per text, a few in flight at a time."""
    limit = asyncio.Semaphore(8)

    async def one(text: str) -> list[float]:
        async with limit:
            return list((await stub.Embed(pb.EmbedRequest(inputs=[text]))).embeddings[0].values)

    return np.array(await asyncio.gather(*(one(t) for t in texts)), dtype=np.float32)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_20k_lines_killed_half_way_then_resumed(start_server, embed_models_root, tmp_path):
    running = await start_server(embed_models_root)
    corpus = tmp_path / "corpus.txt"
    texts = write_corpus(corpus, LINES)
    output = tmp_path / "embeddings.parquet"
    ledger = tmp_path / "embeddings.parquet.parts" / "ledger.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "client.batch",
        str(corpus),
        "--output",
        str(output),
        "--address",
        running.address,
        "--chunk-size",
        str(CHUNK),
        "--batch-size",
        "25",
        "--concurrency",
        "3",
        "--no-progress",
        "--log-level",
        "WARNING",
    ]

    first = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    await until(
        lambda: len(ledger_chunks(ledger)) >= CHUNKS // 2 or first.returncode is not None, 300, "half of the chunks"
    )
    first.kill()
    await first.wait()
    assert first.returncode == -9, (await first.stderr.read()).decode()
    done_before_kill = ledger_chunks(ledger)
    assert CHUNKS // 2 <= len(done_before_kill) < CHUNKS
    assert not output.exists()

    calls_before = stream_calls()
    second = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    _, stderr = await second.communicate()
    assert second.returncode == 0, stderr.decode()
    # The resumed run streamed only the chunks the first one had not finished (one stream each).
    await until(lambda: stream_calls() - calls_before >= CHUNKS - len(done_before_kill), 10, "stream metrics")
    assert stream_calls() - calls_before == CHUNKS - len(done_before_kill)

    table = pq.read_table(output)
    assert table.column("id").to_pylist() == list(range(LINES))  # every line, once, in order
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    assert vectors.shape[0] == LINES
    assert (tmp_path / "embeddings.parquet.failures.jsonl").read_text() == ""

    rng = random.Random(1)
    sample = sorted({0, LINES - 1, CHUNK - 1, CHUNK, *rng.sample(range(LINES), 300)})
    expected = await single_embeddings(running.embedding, [texts[i] for i in sample])
    np.testing.assert_allclose(vectors[sample], expected, atol=2e-5)

    # A third run finds the job complete and sends nothing.
    calls_before = stream_calls()
    third = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    _, stderr = await third.communicate()
    assert third.returncode == 0, stderr.decode()
    assert stream_calls() == calls_before
    assert pq.read_table(output).num_rows == LINES
