"""The output folder of a Ray batch job: one Parquet part per input chunk, each committed by a rename.

    OUT/
      _job.json                  the job's parameters: a rerun with other ones is refused
      part-00000012.parquet      chunk 12: columns id, embedding (fixed-size list of float32 | float16)
      _SUCCESS                   written once every chunk has its part: rows and skipped bad lines

A part is written under a temporary name (`.part-00000012.parquet.<random>.tmp`) and renamed, so a
part on disk is whole. Its name is its chunk's, so the same chunk run twice (a Ray task retried
after its actor died, or a killed job rerun while an old actor still runs) lands on the same name
with the same rows: every id is written once. A rerun lists the committed parts, reads only the
chunks without one and removes leftover temporary files. The number of bad lines a chunk skipped
travels in its part's Parquet metadata (`ts.bad_lines`). Readers of the folder
(`pyarrow.dataset`, Ray, Spark) skip names starting with `_` or `.`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from client.batch.store import changed_parameters

log = logging.getLogger(__name__)

JOB_FILE = "_job.json"
SUCCESS_FILE = "_SUCCESS"
BAD_LINES_KEY = b"ts.bad_lines"
DTYPES = {"float32": pa.float32(), "float16": pa.float16()}
_PART = re.compile(r"part-(\d{8})\.parquet")
_OURS = re.compile(r"(part-\d{8}\.parquet|\.part-\d{8}\.parquet\.[0-9a-f]+\.tmp|\.?(_job\.json|_SUCCESS)(\.tmp)?)")
# Header keys that may change between runs of one job (everything else must match to resume).
_INFORMATIONAL = ("input",)


class JobMismatch(ValueError):
    """The output folder holds another job's parts, or files that are no job's."""


class Incomplete(RuntimeError):
    """Chunks without a part at the end of a run (a rerun of the same command finishes them)."""


@dataclass(frozen=True)
class Summary:
    output: Path
    rows: int  # embeddings in the folder
    bad_lines: int  # lines skipped as bad (--skip-bad), over every run of the job
    chunks: int


def part_name(chunk: int) -> str:
    return f"part-{chunk:08d}.parquet"


def part_table(ids: pa.Array, vectors: np.ndarray, dtype: str) -> pa.Table:
    """Columns id and embedding: (n,) fixed-size lists of D values of `dtype`."""
    values = pa.array(np.ascontiguousarray(vectors, dtype=dtype).reshape(-1), type=DTYPES[dtype])
    return pa.table({"id": ids, "embedding": pa.FixedSizeListArray.from_arrays(values, vectors.shape[1])})


def write_part(root: Path, chunk: int, table: pa.Table, bad_lines: int) -> Path:
    """Writes chunk's part under a temporary name, then renames it into place (atomic on one filesystem)."""
    final = Path(root) / part_name(chunk)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    table = table.replace_schema_metadata({BAD_LINES_KEY: str(bad_lines).encode()})
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


class PartsFolder:
    def __init__(self, root: Path, header: dict[str, Any]):
        self.root, self.header = Path(root), header

    def open(self, restart: bool = False) -> set[int]:
        """Checks (or starts) the folder; returns the chunks already committed. Raises JobMismatch."""
        if self.root.exists() and not self.root.is_dir():
            raise JobMismatch(f"--output {self.root} is a file; the Ray engine writes a folder of part files")
        self.root.mkdir(parents=True, exist_ok=True)
        foreign = sorted(p.name for p in self.root.iterdir() if not _OURS.fullmatch(p.name))
        if foreign:
            raise JobMismatch(
                f"--output {self.root} holds files that are not this job's ({', '.join(foreign[:5])}); "
                "choose a new or empty folder"
            )
        if restart:
            log.warning("--restart: removing the parts in %s", self.root)
            for p in self.root.iterdir():
                p.unlink()
        job = self.root / JOB_FILE
        if job.is_file():
            self._check(json.loads(job.read_text(encoding="utf-8")))
        else:
            _write_atomic(job, json.dumps(self.header, indent=1) + "\n")
        for p in self.root.glob(".*.tmp"):  # a killed run's unfinished writes
            p.unlink(missing_ok=True)
        return self.done()

    def _check(self, old: dict[str, Any]) -> None:
        if changed := changed_parameters(old, self.header, _INFORMATIONAL):
            raise JobMismatch(
                f"{self.root} holds a job with other parameters ({changed}); rerun with the same "
                "parameters to resume, or pass --restart to start over"
            )

    def done(self) -> set[int]:
        return {int(m.group(1)) for p in self.root.iterdir() if (m := _PART.fullmatch(p.name))}

    def finish(self, chunks: int) -> Summary:
        """Totals from the parts' footers; writes _SUCCESS when all `chunks` are committed."""
        rows = bad = 0
        done = sorted(self.done())
        for c in done:
            meta = pq.read_metadata(self.root / part_name(c))
            rows += meta.num_rows
            bad += int((meta.metadata or {}).get(BAD_LINES_KEY, b"0"))
        missing = sorted(set(range(chunks)) - set(done))
        if missing:
            raise Incomplete(
                f"{self.root}: {len(missing)} of {chunks} chunks have no part (first: {missing[0]}); "
                "rerun the same command to finish them"
            )
        summary = Summary(self.root, rows, bad, chunks)
        _write_atomic(self.root / SUCCESS_FILE, json.dumps({"rows": rows, "bad_lines": bad, "chunks": chunks}) + "\n")
        return summary


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
