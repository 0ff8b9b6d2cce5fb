"""Input of a Ray batch job: the file as numbered chunks of lines, one Ray Data block per chunk.

Chunk c holds lines [c * K, (c + 1) * K) of a text or JSONL file (rows of a Parquet file), K =
`--chunk-size`; its block has one row per line: `chunk`, `line` (0-based), `id`, `text` and
`error` (why the line is bad, else null). Blank lines are rows with neither text nor error: they
are skipped, as by the gRPC engine, but still counted, so a block holds exactly its chunk's K
lines and the actor can tell a whole chunk from a piece of one. Chunk numbers depend only on the
file and K, which is what makes a chunk the unit of output and of resumption (client/batch/parts.py).

`make_plan` finds the byte offset of every chunk's first line in one pass over the file, on the
driver; a read task seeks there, so the line numbers in messages are the file's. A bad line
(not JSON, no id, no text or an empty one; a null Parquet value) raises `BadInput` naming the file
and line, unless `skip_bad`: then it travels as an `error` row, is counted and never embedded.
Text ids are line numbers, JSONL ids strings, Parquet ids keep their column's type (or the row
number), as in client/batch/sources.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from client.batch.sources import InputError, SourceSpec, id_type, jsonl_record


class BadInput(ValueError):
    """A line that cannot be embedded: `path:line: why` (or `path:row N: why` for Parquet)."""


@dataclass(frozen=True)
class Plan:
    spec: SourceSpec
    chunk_size: int
    rows: int  # lines of a text / JSONL file, rows of a Parquet file
    offsets: tuple[int, ...]  # byte offset of each chunk's first line (text / JSONL)
    id_type: pa.DataType

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.chunk_size)

    def chunk_rows(self, chunk: int) -> int:
        return min(self.chunk_size, self.rows - chunk * self.chunk_size)

    def light(self) -> Plan:
        """The plan without the offsets (what tasks and actors need: sizes, not positions)."""
        return replace(self, offsets=())

    def schema(self) -> pa.Schema:
        return pa.schema(
            [
                ("chunk", pa.int64()),
                ("line", pa.int64()),
                ("id", self.id_type),
                ("text", pa.string()),
                ("error", pa.string()),
            ]
        )


def make_plan(spec: SourceSpec, chunk_size: int) -> Plan:
    """Counts the rows and, for line formats, records where every chunk starts (one pass, binary)."""
    if not spec.path.is_file():
        raise InputError(f"{spec.path}: no such file")
    if spec.format == "parquet":
        names = pq.ParquetFile(spec.path).schema_arrow.names
        if spec.text_field not in names:
            raise InputError(
                f"{spec.path}: no column {spec.text_field!r} (columns: {', '.join(names)}); pass --text-field"
            )
        return Plan(spec, chunk_size, pq.ParquetFile(spec.path).metadata.num_rows, (), id_type(spec))
    offsets, rows, position = [], 0, 0
    with open(spec.path, "rb") as f:
        for line in f:
            if rows % chunk_size == 0:
                offsets.append(position)
            position += len(line)
            rows += 1
    return Plan(spec, chunk_size, rows, tuple(offsets), id_type(spec))


def read_chunk(plan: Plan, chunk: int, offset: int, skip_bad: bool) -> pa.Table:
    """The block of one chunk, whose first line starts at byte `offset` (see the module docstring);
    raises BadInput unless skip_bad."""
    first, count = chunk * plan.chunk_size, plan.chunk_rows(chunk)
    if plan.spec.format == "parquet":
        rows = _parquet_rows(plan, first, count)
    else:
        rows = _line_rows(plan, offset, first, count)
    if not skip_bad:
        bad = next((r for r in rows if r[3]), None)
        if bad is not None:
            raise BadInput(f"{bad[3]}; fix it, or pass --skip-bad to leave such lines out (they are counted)")
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    return pa.Table.from_arrays(
        [
            pa.array([chunk] * len(rows), pa.int64()),
            pa.array(columns[0], pa.int64()),
            pa.array(columns[1], plan.id_type),
            pa.array(columns[2], pa.string()),
            pa.array(columns[3], pa.string()),
        ],
        schema=plan.schema(),
    )


Row = tuple[int, Any, "str | None", "str | None"]  # line, id, text, error


def _line_rows(plan: Plan, offset: int, first: int, count: int) -> list[Row]:
    spec, rows = plan.spec, []
    with open(spec.path, "rb") as f:
        f.seek(offset)
        for number in range(first, first + count):
            raw = f.readline()
            if not raw:
                raise InputError(f"{spec.path}: ended at line {number} of {plan.rows}; did it change during the job?")
            rows.append(_line_row(spec, number, raw.decode("utf-8", errors="replace").rstrip("\r\n")))
    return rows


def _line_row(spec: SourceSpec, number: int, line: str) -> Row:
    if not line.strip():
        return number, None, None, None
    if spec.format == "text":
        return number, number, line, None
    item_id, text, error = jsonl_record(line, spec)
    if not error and not text:
        error = f"field {spec.text_field!r} is empty"
    if error:
        return number, None, None, f"{spec.path}:{number + 1}: {error}"
    return number, item_id, text, None


def _parquet_rows(plan: Plan, first: int, count: int) -> list[Row]:
    spec = plan.spec
    pf = pq.ParquetFile(spec.path)
    has_id = spec.id_field in pf.schema_arrow.names
    groups, start, group_first = [], 0, None
    for g in range(pf.metadata.num_row_groups):  # the row groups that hold [first, first + count)
        n = pf.metadata.row_group(g).num_rows
        if start + n > first and start < first + count:
            groups.append(g)
            group_first = start if group_first is None else group_first
        start += n
    columns = [spec.id_field, spec.text_field] if has_id else [spec.text_field]
    table = pf.read_row_groups(groups, columns=columns).slice(first - (group_first or 0), count)
    texts = table.column(spec.text_field).to_pylist()
    ids = table.column(spec.id_field).to_pylist() if has_id else range(first, first + count)
    rows = []
    for number, item_id, text in zip(range(first, first + count), ids, texts, strict=False):  # short: caught later
        error = None
        if item_id is None:
            error = f"{spec.path}:row {number}: {spec.id_field!r} is null"
        elif not isinstance(text, str) or not text:
            error = f"{spec.path}:row {number}: {spec.text_field!r} is null, empty or not a string"
        rows.append((number, None if error else item_id, None if error else text, error))
    return rows


class ChunkSource(Datasource):
    """The chunks still to do, as Ray Data read tasks that yield one block per chunk."""

    def __init__(self, plan: Plan, chunks: list[int], skip_bad: bool):
        super().__init__()
        self.plan, self.todo, self.skip_bad = plan, list(chunks), skip_bad

    def get_name(self) -> str:
        return f"Chunks({Path(self.plan.spec.path).name})"

    def estimate_inmemory_data_size(self) -> int | None:
        size = Path(self.plan.spec.path).stat().st_size
        return size * len(self.todo) // max(self.plan.chunks, 1)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        tasks = max(1, min(parallelism, len(self.todo)))
        light = self.plan.light()  # a task carries its own chunks' offsets, not the whole file's
        offsets = self.plan.offsets or (0,) * self.plan.chunks
        groups = [[(c, offsets[c]) for c in self.todo[i::tasks]] for i in range(tasks)]
        return [
            ReadTask(
                partial(_read_group, light, group, self.skip_bad),
                BlockMetadata(
                    num_rows=sum(light.chunk_rows(c) for c, _ in group),
                    size_bytes=None,
                    input_files=(str(light.spec.path),),
                    exec_stats=None,
                ),
                schema=light.schema(),
            )
            for group in groups
            if group
        ]


def _read_group(plan: Plan, chunks: list[tuple[int, int]], skip_bad: bool):
    for chunk, offset in chunks:
        yield read_chunk(plan, chunk, offset, skip_bad)
