"""Resumable output of a batch embedding job: part files, a ledger, and the final merge.

Beside the output file, `<output>.parts/` holds one Parquet part per finished chunk
(`part-00000012.parquet`: columns `id`, `embedding`) and `ledger.jsonl`: a header line with the
job's parameters, then one line per finished chunk (its row count and per-item failures). A part
is written to a temporary name and renamed before its ledger line is appended (and fsync'ed), so
a chunk is either done (in the ledger, its part on disk) or redone from scratch after a crash:
nothing is lost and nothing is written twice. A restart with different parameters is refused.

When every chunk of the shard is done, `finalize` merges the parts in chunk order into the output
(Parquet, or .npy + `<stem>.ids.npy`), writes `<output>.failures.jsonl`, marks the ledger
complete and deletes the parts; a later run finds the job complete and does nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from client.batch.embedder import ChunkResult

log = logging.getLogger(__name__)

LEDGER = "ledger.jsonl"
LEDGER_VERSION = 1
DTYPES = {"float32": pa.float32(), "float16": pa.float16()}
# Header keys that may differ between runs (everything else must match to resume).
_INFORMATIONAL = ("input", "version")


class LedgerMismatch(ValueError):
    """The work folder belongs to a job with other parameters."""


@dataclass(frozen=True)
class Summary:
    output: Path
    rows: int
    failed: int
    failures_file: Path


class JobStore:
    def __init__(self, output: Path, header: dict[str, Any], id_type: pa.DataType, dim: int, dtype: str):
        self.output = Path(output)
        self.work = self.output.with_name(self.output.name + ".parts")
        self.header = {"version": LEDGER_VERSION, **header}
        self.id_type, self.dim, self.dtype = id_type, dim, dtype
        self.done: dict[int, dict[str, Any]] = {}
        self.complete: dict[str, Any] | None = None

    @property
    def ledger(self) -> Path:
        return self.work / LEDGER

    @property
    def failures_file(self) -> Path:
        return self.output.with_name(self.output.name + ".failures.jsonl")

    def open(self, restart: bool = False) -> None:
        """Reads the ledger (or starts one); raises LedgerMismatch for another job's folder."""
        if restart and self.work.exists():
            log.warning("--restart: discarding %s", self.work)
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True, exist_ok=True)
        records = _read_ledger(self.ledger)
        if records and self.complete_record(records) and not self.output.exists():
            log.warning("ledger says complete but %s is missing: starting over", self.output)
            records = []
        if not records:
            self.ledger.write_text(json.dumps({"header": self.header}) + "\n")
            return
        self._check_header(records[0].get("header", {}))
        self.complete = self.complete_record(records)
        for r in records[1:]:
            if "chunk" in r and (self.work / _part_name(r["chunk"])).is_file():
                self.done[r["chunk"]] = r

    @staticmethod
    def complete_record(records: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((r for r in records if r.get("complete")), None)

    def _check_header(self, old: dict[str, Any]) -> None:
        if changed := changed_parameters(old, self.header, _INFORMATIONAL):
            raise LedgerMismatch(
                f"{self.work} holds a job with other parameters ({changed}); "
                "rerun with the same parameters to resume, or pass --restart to start over"
            )

    def rows_done(self) -> int:
        return sum(r["rows"] + len(r["failures"]) for r in self.done.values())

    def write_chunk(self, result: ChunkResult) -> None:
        """Writes the chunk's part, then records it in the ledger (blocking: run it in a thread)."""
        part = self.work / _part_name(result.index)
        tmp = part.with_name("." + part.name + ".tmp")
        pq.write_table(self._table(result.ids, result.vectors), tmp)
        os.replace(tmp, part)
        record = {"chunk": result.index, "rows": len(result.ids), "failures": result.failures}
        with open(self.ledger, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done[result.index] = record

    def _table(self, ids: list[Any], vectors: np.ndarray) -> pa.Table:
        values = pa.array(np.ascontiguousarray(vectors, dtype=self.dtype).reshape(-1), type=DTYPES[self.dtype])
        embedding = pa.FixedSizeListArray.from_arrays(values, self.dim)  # (n,) lists of D
        return pa.table({"id": pa.array(ids, type=self.id_type), "embedding": embedding})

    def finalize(self) -> Summary:
        """Merges the parts into the output; returns what was written."""
        if self.complete:
            return Summary(self.output, self.complete["rows"], self.complete["failed"], self.failures_file)
        chunks = sorted(self.done)
        rows = sum(self.done[c]["rows"] for c in chunks)
        if self.output.suffix == ".npy":
            _merge_npy([self.work / _part_name(c) for c in chunks], self.output, rows, self.dim, self.dtype)
        else:
            empty = self._table([], np.zeros((0, self.dim), dtype=np.float32))
            _merge_parquet([self.work / _part_name(c) for c in chunks], self.output, empty)
        failed = self._write_failures(chunks)
        with open(self.ledger, "a", encoding="utf-8") as f:
            f.write(json.dumps({"complete": True, "rows": rows, "failed": failed}) + "\n")
        for c in chunks:
            (self.work / _part_name(c)).unlink()
        return Summary(self.output, rows, failed, self.failures_file)

    def _write_failures(self, chunks: list[int]) -> int:
        tmp = self.failures_file.with_name("." + self.failures_file.name + ".tmp")
        failed = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for c in chunks:
                for failure in self.done[c]["failures"]:
                    f.write(json.dumps({"chunk": c, **failure}, ensure_ascii=False, default=str) + "\n")
                    failed += 1
        os.replace(tmp, self.failures_file)
        return failed


def changed_parameters(old: dict[str, Any], new: dict[str, Any], informational: tuple[str, ...]) -> str:
    """'key: was X, now Y; ...' for every job parameter that differs (informational keys aside), or ''."""
    keys = sorted((set(old) | set(new)) - set(informational))
    return "; ".join(f"{k}: was {old.get(k)!r}, now {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))


def _part_name(chunk: int) -> str:
    return f"part-{chunk:08d}.parquet"


def _read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s line %d: unreadable (a write cut short by a crash?); ignored", path, number)
    return records


def _merge_parquet(parts: list[Path], output: Path, empty: pa.Table) -> None:
    """Concatenates the parts (in the order given) into one file; `empty` gives the schema."""
    tmp = output.with_name("." + output.name + ".tmp")
    with pq.ParquetWriter(tmp, empty.schema) as writer:
        for part in parts:
            writer.write_table(pq.read_table(part, schema=empty.schema))
    os.replace(tmp, output)


def _merge_npy(parts: list[Path], output: Path, rows: int, dim: int, dtype: str) -> None:
    tmp = output.with_name("." + output.stem + ".tmp.npy")
    matrix = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(rows, dim))
    ids: list[np.ndarray] = []
    at = 0
    for part in parts:
        table = pq.read_table(part)
        n = table.num_rows
        flat = table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        matrix[at : at + n] = flat.reshape(n, dim)  # (n, D)
        ids.append(np.asarray(table.column("id").to_numpy(zero_copy_only=False)))
        at += n
    matrix.flush()
    del matrix
    id_array = np.concatenate(ids) if ids else np.array([], dtype=np.int64)
    if id_array.dtype == object:
        id_array = id_array.astype(str)
    ids_path = output.with_name(output.stem + ".ids.npy")
    np.save(ids_path, id_array, allow_pickle=False)
    os.replace(tmp, output)
