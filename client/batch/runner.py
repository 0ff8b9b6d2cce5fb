"""Runs one batch embedding job (one shard of one input file) end to end.

    summary = asyncio.run(run_job(JobConfig(input=Path("corpus.jsonl"), output=Path("out.parquet"))))

A producer reads the shard's unfinished chunks into a bounded queue; `concurrency` workers each
embed one chunk at a time on its own EmbedStream (so up to concurrency x window requests are in
flight) and hand the result to the store, which writes its part and ledger line off the event
loop. Progress: a tqdm bar (rate, ETA), or a log line every `log_every` seconds without one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from client.batch import sources
from client.batch.embedder import ChunkEmbedder, EmbedOptions
from client.batch.store import JobStore, Summary
from client.channel import Credentials, open_channel
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Round robin over every address the target resolves to (a headless service: every ready pod).
SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


@dataclass(frozen=True)
class JobConfig:
    input: Path
    output: Path  # .parquet or .npy, shard placeholders already filled in
    address: str = "127.0.0.1:50051"
    credentials: Credentials = field(default_factory=Credentials)  # token, TLS (client/channel.py)
    format: str | None = None
    id_field: str = "id"
    text_field: str = "text"
    dtype: str = "float32"
    chunk_size: int = 1024
    concurrency: int = 4
    shard_index: int = 0
    shard_count: int = 1
    restart: bool = False
    progress: bool = True
    log_every: float = 30.0
    embed: EmbedOptions = field(default_factory=EmbedOptions)


def channel_options() -> list[tuple[str, object]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.service_config", SERVICE_CONFIG),
    ]


async def run_job(cfg: JobConfig) -> Summary:
    spec = sources.SourceSpec(cfg.input, sources.detect_format(cfg.input, cfg.format), cfg.id_field, cfg.text_field)
    if not cfg.input.is_file():
        raise sources.InputError(f"{cfg.input}: no such file")
    async with open_channel(cfg.address, cfg.credentials, channel_options(), aio=True) as channel:
        embedder = ChunkEmbedder(pb_grpc.EmbeddingServiceStub(channel), cfg.embed)
        dim = await embedder.probe()
        store = JobStore(cfg.output, _header(cfg, spec, embedder.model, dim), sources.id_type(spec), dim, cfg.dtype)
        store.open(restart=cfg.restart)
        if store.complete:
            log.info("%s: already complete (ledger %s); nothing to do", cfg.output, store.ledger)
            return store.finalize()
        total = sources.shard_item_count(sources.count_items(spec), cfg.chunk_size, cfg.shard_index, cfg.shard_count)
        log.info(
            "shard %d/%d of %s: %d texts, %d already done; model %s, dimension %d",
            cfg.shard_index,
            cfg.shard_count,
            cfg.input,
            total,
            store.rows_done(),
            embedder.model,
            dim,
        )
        with _Progress(total, store.rows_done(), cfg.progress, cfg.log_every) as progress:
            await _pump(cfg, spec, store, embedder, progress)
    summary = await asyncio.to_thread(store.finalize)
    log.info(
        "wrote %d embeddings to %s; %d failed items in %s",
        summary.rows,
        summary.output,
        summary.failed,
        summary.failures_file,
    )
    return summary


def _header(cfg: JobConfig, spec: sources.SourceSpec, model: str, dim: int) -> dict:
    o = cfg.embed
    return {
        "input": str(cfg.input),
        "input_fingerprint": sources.fingerprint(cfg.input),
        "format": spec.format,
        "id_field": spec.id_field,
        "text_field": spec.text_field,
        "chunk_size": cfg.chunk_size,
        "shard_index": cfg.shard_index,
        "shard_count": cfg.shard_count,
        "model": model,
        "dimension": dim,
        "normalize": o.normalize,
        "truncate": o.truncate,
        "dtype": cfg.dtype,
    }


async def _pump(
    cfg: JobConfig, spec: sources.SourceSpec, store: JobStore, embedder: ChunkEmbedder, progress: _Progress
) -> None:
    queue: asyncio.Queue = asyncio.Queue(maxsize=cfg.concurrency)

    async def produce() -> None:
        chunks = sources.iter_chunks(
            sources.iter_items(spec), cfg.chunk_size, cfg.shard_index, cfg.shard_count, skip=frozenset(store.done)
        )
        for chunk in chunks:
            await queue.put(chunk)
        for _ in range(cfg.concurrency):
            await queue.put(None)

    async def work() -> None:
        while (chunk := await queue.get()) is not None:
            result = await embedder.embed(chunk)
            await asyncio.to_thread(store.write_chunk, result)
            progress.update(len(chunk.items))

    tasks = [asyncio.ensure_future(produce())] + [asyncio.ensure_future(work()) for _ in range(cfg.concurrency)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Progress:
    """tqdm bar (rate, ETA) when enabled; otherwise a log line every `log_every` seconds."""

    def __init__(self, total: int, done: int, bar: bool, log_every: float):
        self.total, self.done, self.log_every = total, done, log_every
        self.bar = tqdm(
            total=total, initial=done, unit="text", unit_scale=True, smoothing=0.05, desc="embedding", disable=not bar
        )
        self.start, self.start_done, self.last_log = time.monotonic(), done, time.monotonic()

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)
        now = time.monotonic()
        if self.bar.disable and now - self.last_log >= self.log_every:
            self.last_log = now
            rate = (self.done - self.start_done) / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            log.info(
                "%d/%d texts (%.1f%%), %.0f texts/s, ETA %.0fs",
                self.done,
                self.total,
                100.0 * self.done / max(self.total, 1),
                rate,
                eta,
            )
