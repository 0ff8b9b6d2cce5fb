"""Input files of a batch embedding job, read as a stream of items cut into numbered chunks.

Formats (chosen by extension, or `--format`):
- text:    one text per line; the id is the 0-based line number (int64); blank lines are skipped.
- jsonl:   one JSON object per line with an id field and a text field (names configurable); ids
           are kept as strings (ints written in decimal). A malformed line becomes a failed item.
- parquet: an id column (any Arrow type, kept as is; absent: the row number) and a text column.

Chunk c holds items [c * chunk_size, (c + 1) * chunk_size) of the whole file, so chunk numbers
do not depend on sharding: shard k of n processes the chunks with c % n == k. A chunk is the unit
of work, of output (one part file) and of resumption.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

FORMATS = ("text", "jsonl", "parquet")
_EXTENSIONS = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


class InputError(ValueError):
    """The input file cannot be read as asked (missing, unknown format, missing column)."""


@dataclass
class Item:
    id: Any
    text: str | None  # None: the item is invalid, `error` says why
    error: str = ""


@dataclass
class Chunk:
    index: int
    items: list[Item] = field(default_factory=list)


@dataclass(frozen=True)
class SourceSpec:
    path: Path
    format: str
    id_field: str = "id"
    text_field: str = "text"


def detect_format(path: Path, fmt: str | None) -> str:
    if fmt:
        if fmt not in FORMATS:
            raise InputError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
        return fmt
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in (".gz",)]
    found = _EXTENSIONS.get(suffixes[-1] if suffixes else "")
    if not found:
        raise InputError(f"{path}: cannot tell the format from the extension; pass --format {'|'.join(FORMATS)}")
    return found


def fingerprint(path: Path) -> dict[str, Any]:
    """Size and a hash of the first MiB: enough to notice a different input on resume."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return {"size": os.path.getsize(path), "head_sha256": h.hexdigest()}


def id_type(spec: SourceSpec) -> pa.DataType:
    """The Arrow type of the output id column."""
    import pyarrow as pa

    if spec.format == "text":
        return pa.int64()
    if spec.format == "jsonl":
        return pa.string()
    import pyarrow.parquet as pq

    schema = pq.ParquetFile(spec.path).schema_arrow
    return schema.field(spec.id_field).type if spec.id_field in schema.names else pa.int64()


def iter_items(spec: SourceSpec) -> Iterator[Item]:
    """Every item of the file, in order (invalid ones included, with their error)."""
    if spec.format == "text":
        return _text_items(spec.path)
    if spec.format == "jsonl":
        return _jsonl_items(spec)
    return _parquet_items(spec)


def count_items(spec: SourceSpec) -> int:
    """Items in the file (a full pass over text/JSONL lines; Parquet reads its footer)."""
    if spec.format == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(spec.path).metadata.num_rows
    with open(spec.path, encoding="utf-8", errors="replace") as f:
        return sum(1 for line in f if line.strip())


def shard_item_count(total: int, chunk_size: int, shard_index: int, shard_count: int) -> int:
    """How many of `total` items fall in the chunks of one shard."""
    chunks = -(-total // chunk_size)
    count = 0
    for c in range(shard_index, chunks, shard_count):
        count += min(chunk_size, total - c * chunk_size)
    return count


def iter_chunks(
    items: Iterator[Item],
    chunk_size: int,
    shard_index: int = 0,
    shard_count: int = 1,
    skip: frozenset[int] = frozenset(),
) -> Iterator[Chunk]:
    """The chunks of one shard, in order, leaving out those in `skip` (already done)."""
    chunk = Chunk(0)
    for item in items:
        chunk.items.append(item)
        if len(chunk.items) == chunk_size:
            if _wanted(chunk.index, shard_index, shard_count, skip):
                yield chunk
            chunk = Chunk(chunk.index + 1)
    if chunk.items and _wanted(chunk.index, shard_index, shard_count, skip):
        yield chunk


def _wanted(index: int, shard_index: int, shard_count: int, skip: frozenset[int]) -> bool:
    return index % shard_count == shard_index and index not in skip


def _text_items(path: Path) -> Iterator[Item]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f):
            text = line.rstrip("\r\n")
            if text.strip():
                yield Item(number, text)


def _jsonl_items(spec: SourceSpec) -> Iterator[Item]:
    with open(spec.path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f):
            if line.strip():
                yield _jsonl_item(line, number, spec)


def _jsonl_item(line: str, number: int, spec: SourceSpec) -> Item:
    item_id, text, error = jsonl_record(line, spec)
    if error:
        return Item(item_id or f"line:{number + 1}", None, f"line {number + 1}: {error}")
    return Item(item_id, text)


def jsonl_record(line: str, spec: SourceSpec) -> tuple[str | None, str | None, str]:
    """One JSONL line -> (id, text, "") or, when the line is bad, (id or None, None, why)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, None, f"not JSON ({e.msg})"
    if not isinstance(record, dict):
        return None, None, "expected a JSON object"
    raw_id = record.get(spec.id_field)
    if raw_id is None or isinstance(raw_id, (bool, dict, list)):
        return None, None, f"field {spec.id_field!r} missing or not a string/number"
    text = record.get(spec.text_field)
    if not isinstance(text, str):
        return str(raw_id), None, f"field {spec.text_field!r} missing or not a string"
    return str(raw_id), text, ""


def _parquet_items(spec: SourceSpec) -> Iterator[Item]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(spec.path)
    names = pf.schema_arrow.names
    if spec.text_field not in names:
        raise InputError(f"{spec.path}: no column {spec.text_field!r} (columns: {', '.join(names)}); pass --text-field")
    has_id = spec.id_field in names
    columns = [spec.id_field, spec.text_field] if has_id else [spec.text_field]
    row = 0
    for batch in pf.iter_batches(batch_size=8192, columns=columns):
        texts = batch.column(spec.text_field).to_pylist()
        ids = batch.column(spec.id_field).to_pylist() if has_id else range(row, row + len(texts))
        for item_id, text in zip(ids, texts, strict=True):
            if isinstance(text, str):
                yield Item(item_id, text)
            else:
                yield Item(item_id, None, f"row {row}: {spec.text_field!r} is null or not a string")
            row += 1
