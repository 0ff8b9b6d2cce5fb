"""The Ray engine of the batch job (`ts-embed-batch --engine ray`) on a real local Ray (2 CPUs):
row count, unique ids, vectors equal to a real server's Embed, a rerun that adds nothing, a
driver SIGKILLed midway then rerun (every id once), bad lines (stop with file:line, or skipped
and counted), text and Parquet input, float16 output; the output folder's rules without Ray.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from client.batch import cli
from client.batch.parts import SUCCESS_FILE, JobMismatch, PartsFolder, part_table, write_part
from client.batch.ray_job import RayJobConfig, run_ray_job
from client.batch.ray_source import BadInput
from service.proto import inference_pb2 as pb
from service.runtime import CUDA, ProviderError
from tests.paths import ROOT

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_address() -> str:
    """One local cluster for the module (ray.init takes 4-6 s): jobs here run in it, a subprocess joins it."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 * 1024)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def write_jsonl(path: Path, lines: int, seed: int = 0) -> dict[str, str]:
    """Pseudo-sentences of 3 to 24 words with ids doc-N; returns id -> text."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ter", "an", "so", "ve", "ri", "pu", "den", "ol", "ish"]
    texts = {}
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(rng.randint(3, 24))]
            texts[f"doc-{i}"] = f"{' '.join(words)} {i}"
            f.write(json.dumps({"id": f"doc-{i}", "text": texts[f"doc-{i}"]}) + "\n")
    return texts


def job(input: Path, output: Path, models: Path, **kw) -> RayJobConfig:
    return RayJobConfig(
        input=input,
        output=output,
        models=models,
        model="tiny-embed",
        num_actors=2,
        progress=False,
        **{"chunk_size": 250, **kw},
    )


def read_output(folder: Path) -> pa.Table:
    return pads.dataset(folder, format="parquet").to_table()  # skips _job.json, _SUCCESS, .tmp


async def test_ray_job_equals_the_service_and_a_rerun_adds_nothing(
    ray_address, embed_models_root, start_server, tmp_path
):
    texts = write_jsonl(tmp_path / "corpus.jsonl", 3000)
    cfg = job(tmp_path / "corpus.jsonl", tmp_path / "out", embed_models_root, batch_size=16)
    summary = run_ray_job(cfg)
    assert (summary.rows, summary.bad_lines, summary.chunks) == (3000, 0, 12)
    table = read_output(tmp_path / "out")
    ids = table.column("id").to_pylist()
    assert len(ids) == 3000 and set(ids) == set(texts)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 32)

    running = await start_server(embed_models_root)
    order = list(texts)
    expected = []
    for i in range(0, len(order), 64):
        response = await running.embedding.Embed(pb.EmbedRequest(inputs=[texts[k] for k in order[i : i + 64]]))
        expected += [list(e.values) for e in response.embeddings]
    expected = np.array(expected, dtype=np.float32)  # (3000, 32), unit rows
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)[np.argsort(ids)]
    expected = expected[np.argsort(order)]
    cosines = (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.9999

    parts = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*.parquet")}
    again = run_ray_job(cfg)  # finds every chunk committed: no Ray work, nothing written
    assert again.rows == 3000
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*.parquet")} == parts
    assert json.loads((tmp_path / "out" / SUCCESS_FILE).read_text())["rows"] == 3000


def test_killed_midway_then_rerun_writes_every_id_once(ray_address, embed_models_root, tmp_path):
    texts = write_jsonl(tmp_path / "corpus.jsonl", 6000, seed=1)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "client.batch",
        "--engine",
        "ray",
        str(tmp_path / "corpus.jsonl"),
        "--output",
        str(out),
        "--models",
        str(embed_models_root),
        "--model",
        "tiny-embed",
        "--ray-address",
        ray_address,
        "--num-actors",
        "2",
        "--chunk-size",
        "100",
        "--batch-size",
        "4",
        "--no-progress",
        "--log-level",
        "WARNING",
    ]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list(out.glob("part-*.parquet"))) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    _, stderr = first.communicate()
    assert first.returncode == -9, stderr.decode()[-3000:]
    committed = len(list(out.glob("part-*.parquet")))
    assert 3 <= committed < 60, committed

    summary = run_ray_job(job(tmp_path / "corpus.jsonl", out, embed_models_root, chunk_size=100, batch_size=4))
    assert summary.rows == 6000
    ids = read_output(out).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 6000 and set(ids) == set(texts)
    assert not list(out.glob(".*.tmp"))


def test_a_bad_line_stops_the_job_with_file_and_line(ray_address, embed_models_root, tmp_path, caplog):
    write_jsonl(tmp_path / "corpus.jsonl", 600)
    lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
    lines[456] = json.dumps({"id": "doc-456", "txt": "a misspelt field"})
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    argv = [
        "--engine",
        "ray",
        str(tmp_path / "bad.jsonl"),
        "--output",
        str(tmp_path / "out"),
        "--models",
        str(embed_models_root),
        "--model",
        "tiny-embed",
        "--num-actors",
        "2",
        "--chunk-size",
        "100",
        "--no-progress",
    ]
    assert cli.main(argv) == 1
    assert "bad.jsonl:457: field 'text' missing or not a string" in caplog.text
    assert "--skip-bad" in caplog.text
    assert not (tmp_path / "out" / "part-00000004.parquet").exists()  # the chunk of line 457
    with pytest.raises(BadInput, match=r"bad\.jsonl:457: "):
        run_ray_job(job(tmp_path / "bad.jsonl", tmp_path / "out", embed_models_root, chunk_size=100))


def test_skip_bad_counts_bad_lines_and_writes_nothing_for_them(ray_address, embed_models_root, tmp_path, caplog):
    texts = write_jsonl(tmp_path / "corpus.jsonl", 600)
    lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
    lines[10] = "not json at all"
    lines[300] = json.dumps({"text": "no id"})
    lines[301] = json.dumps({"id": "doc-301", "text": ""})
    lines[302] = ""  # blank: skipped, not bad (as the gRPC engine)
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    summary = run_ray_job(job(tmp_path / "bad.jsonl", tmp_path / "out", embed_models_root, skip_bad=True))
    assert (summary.rows, summary.bad_lines) == (596, 3)
    ids = set(read_output(tmp_path / "out").column("id").to_pylist())
    assert ids == set(texts) - {"doc-10", "doc-300", "doc-301", "doc-302"}
    assert "bad.jsonl:11: not JSON" in caplog.text


def test_text_and_parquet_input_float16_output(ray_address, embed_models_root, tmp_path):
    lines = ["first line", "", "third line", *[f"line number {i}" for i in range(3, 300)]]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    summary = run_ray_job(
        job(
            tmp_path / "corpus.txt", tmp_path / "txt", embed_models_root, dtype="float16", dimensions=16, chunk_size=100
        )
    )
    table = read_output(tmp_path / "txt")
    assert summary.rows == 299 and sorted(table.column("id").to_pylist()) == [0, *range(2, 300)]
    assert table.schema.field("embedding").type == pa.list_(pa.float16(), 16)

    pq.write_table(
        pa.table(
            {"key": pa.array(range(1000, 1250), pa.int32()), "body": [f"row {i} of the table" for i in range(250)]}
        ),
        tmp_path / "t.parquet",
        row_group_size=64,
    )
    summary = run_ray_job(
        job(
            tmp_path / "t.parquet",
            tmp_path / "pq",
            embed_models_root,
            id_field="key",
            text_field="body",
            chunk_size=100,
        )
    )
    table = read_output(tmp_path / "pq")
    assert summary.rows == 250 and sorted(table.column("id").to_pylist()) == list(range(1000, 1250))
    assert table.schema.field("id").type == pa.int32()


def test_device_cuda_without_onnxruntime_gpu_fails_clearly(ray_address, embed_models_root, tmp_path):
    import onnxruntime as ort

    if CUDA in ort.get_available_providers():
        pytest.skip("this onnxruntime offers CUDA")
    write_jsonl(tmp_path / "c.jsonl", 10)
    with pytest.raises(ProviderError, match="install onnxruntime-gpu"):
        run_ray_job(job(tmp_path / "c.jsonl", tmp_path / "out", embed_models_root, device="cuda"))


def test_output_folder_refuses_another_job_and_foreign_files(tmp_path):
    folder = PartsFolder(tmp_path / "out", {"model": "a", "chunk_size": 10})
    assert folder.open() == set()
    write_part(tmp_path / "out", 3, part_table(pa.array(["x"]), np.ones((1, 4), np.float32), "float32"), 2)
    (tmp_path / "out" / ".part-00000004.parquet.ab12.tmp").write_bytes(b"half")  # a killed write
    assert PartsFolder(tmp_path / "out", {"model": "a", "chunk_size": 10}).open() == {3}
    assert not (tmp_path / "out" / ".part-00000004.parquet.ab12.tmp").exists()
    with pytest.raises(JobMismatch, match="chunk_size: was 10, now 20"):
        PartsFolder(tmp_path / "out", {"model": "a", "chunk_size": 20}).open()
    assert PartsFolder(tmp_path / "out", {"model": "a", "chunk_size": 20}).open(restart=True) == set()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(JobMismatch, match=r"notes\.txt"):
        PartsFolder(tmp_path / "out", {"model": "a", "chunk_size": 20}).open(restart=True)


def test_ray_stays_out_of_serving():
    root = ROOT
    code = "import sys, service.server, client.batch.cli; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False, cwd=root).returncode == 0
    pyproject = (root / "pyproject.toml").read_text()
    serving = pyproject.split("\ndependencies = [", 1)[1].split("]", 1)[0]  # the serving dependencies
    batch = re.search(r"^batch = \[(.*)\]$", pyproject, re.MULTILINE).group(1)  # what the image installs
    assert "ray" not in serving and "ray" not in batch
    installs = [line for line in (root / "Dockerfile").read_text().splitlines() if "pip install" in line]
    assert installs and not [line for line in installs if "ray" in line]
