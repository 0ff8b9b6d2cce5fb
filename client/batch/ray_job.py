"""The Ray engine of the batch embedding job (`ts-embed-batch --engine ray`): no server, no torch.

    summary = run_ray_job(RayJobConfig(input=Path("corpus.jsonl"), output=Path("out"), models=Path("models")))

Ray Data reads the chunks still to do (client/batch/ray_source.py, one block per chunk);
`map_batches` gives each block to one actor of a fixed pool. An actor loads the model directory
in-process (client/batch/local.py: the service's tokenizer, onnxruntime graph, pooling and
normalisation, so its vectors are the service's), embeds the chunk's texts sorted by token count,
commits the chunk's part file (client/batch/parts.py) and answers one summary row. The driver
streams those rows (Ray's progress display runs meanwhile), logs bad lines skipped with
--skip-bad, and checks at the end that every chunk has its part.

Ray: `--ray-address` (else $RAY_ADDRESS, else a local cluster on this machine's cores) joins a
cluster; every node then needs this package installed and the model and output folders at the
same path (a shared filesystem). With `--device cuda` each actor takes one GPU.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from client.batch import sources
from client.batch.local import (
    LocalEmbedder,
    LocalOptions,
    ModelDir,
    ProviderError,
    check_cuda,
    check_options,
    find_model,
    load_model_dir,
    manifest_sha256,
)
from client.batch.parts import PartsFolder, Summary, part_table, write_part
from client.batch.ray_source import ChunkSource, Plan, make_plan

log = logging.getLogger(__name__)

SUMMARY_SCHEMA = pa.schema(
    [
        ("chunk", pa.int64()),
        ("rows", pa.int64()),
        ("bad_lines", pa.int64()),
        ("first_bad", pa.string()),
        ("variant", pa.string()),
        ("provider", pa.string()),
    ]
)
SHOWN_BAD_LINES = 10  # skipped bad lines logged one by one; the rest are counted


class ActorFailed(RuntimeError):
    """An actor could not load the model (its error's last line; the whole traceback is in Ray's log)."""


# Failures of the job itself (not of Ray): found in the chain of the exception Ray raises.
JOB_ERRORS = (ValueError, ProviderError, ActorFailed)  # ValueError: BadInput, InputError, ModelDirError, options


@dataclass(frozen=True)
class RayJobConfig:
    input: Path
    output: Path  # a folder of part files
    models: Path  # a folder of model directories, or one model directory
    model: str = ""  # empty: the default embedding model, as the service picks it
    variant: str = "auto"
    format: str | None = None
    id_field: str = "id"
    text_field: str = "text"
    dtype: str = "float32"
    normalize: bool = True
    dimensions: int = 0
    chunk_size: int = 1024  # lines per block = per part file
    batch_size: int = 32  # rows per forward pass
    num_actors: int = 0  # 0: the cluster's CPUs / threads (its GPUs with cuda)
    threads: int = 1  # onnxruntime intra-op threads (and CPUs) per actor
    device: str = "cpu"
    ray_address: str | None = None
    restart: bool = False
    skip_bad: bool = False
    progress: bool = True


@dataclass(frozen=True)
class ActorJob:
    """What every actor needs: picklable, small."""

    model_dir: str
    options: LocalOptions
    output: str
    dtype: str
    plan: Plan


class EmbedActor:
    """One model in-process; each call embeds whole chunks and commits their parts."""

    def __init__(self, job: ActorJob):
        self.job = job
        self.embedder = LocalEmbedder(load_model_dir(job.model_dir), job.options)

    def __call__(self, block: pa.Table) -> pa.Table:
        chunks = pc.unique(block["chunk"]).to_pylist()
        return pa.Table.from_pylist(
            [self._chunk(c, block.filter(pc.equal(block["chunk"], c))) for c in chunks], schema=SUMMARY_SCHEMA
        )

    def _chunk(self, chunk: int, rows: pa.Table) -> dict[str, Any]:
        expected = self.job.plan.chunk_rows(chunk)
        if rows.num_rows != expected:  # a part must hold its whole chunk, or a rerun would lose the rest
            raise RuntimeError(
                f"chunk {chunk} arrived as {rows.num_rows} of its {expected} lines (Ray split "
                "its block?); use a smaller --chunk-size"
            )
        good = rows.filter(pc.is_valid(rows["text"]))
        errors = rows["error"].drop_null()
        vectors = self.embedder.embed(good["text"].to_pylist())  # (n, D)
        table = part_table(good["id"].combine_chunks(), vectors, self.job.dtype)
        write_part(Path(self.job.output), chunk, table, len(errors))
        return {
            "chunk": chunk,
            "rows": good.num_rows,
            "bad_lines": len(errors),
            "first_bad": errors[0].as_py() if len(errors) else None,
            "variant": self.embedder.variant,
            "provider": self.embedder.provider,
        }


def run_ray_job(cfg: RayJobConfig) -> Summary:
    """Runs (or resumes) the job; returns the totals of the finished folder."""
    # Absolute paths: the actors' working directory differs from the driver's.
    cfg = replace(cfg, input=cfg.input.resolve(), output=cfg.output.resolve(), models=cfg.models.resolve())
    spec = sources.SourceSpec(cfg.input, sources.detect_format(cfg.input, cfg.format), cfg.id_field, cfg.text_field)
    model_dir = find_model(cfg.models, cfg.model)
    options = LocalOptions(
        device=cfg.device,
        variant=cfg.variant,
        threads=cfg.threads,
        batch_size=cfg.batch_size,
        normalize=cfg.normalize,
        dimensions=cfg.dimensions,
    )
    check_options(model_dir.manifest, options)
    if cfg.device == "cuda" and not (cfg.ray_address or os.environ.get("RAY_ADDRESS")):
        check_cuda()  # the actors run here: fail before Ray starts
    plan = make_plan(spec, cfg.chunk_size)
    folder = PartsFolder(cfg.output, _header(cfg, spec, plan, model_dir))
    done = folder.open(cfg.restart)
    todo = [c for c in range(plan.chunks) if c not in done]
    log.info(
        "%s: %d lines in %d chunks, %d already done; model %s from %s",
        cfg.input,
        plan.rows,
        plan.chunks,
        len(done & set(range(plan.chunks))),
        model_dir.manifest.name,
        model_dir.path,
    )
    if todo:
        _run(cfg, plan, todo, ActorJob(str(model_dir.path), options, str(cfg.output), cfg.dtype, plan.light()))
    summary = folder.finish(plan.chunks)
    log.info(
        "%s: %d embeddings in %d parts; %d bad lines skipped",
        summary.output,
        summary.rows,
        summary.chunks,
        summary.bad_lines,
    )
    return summary


def _header(cfg: RayJobConfig, spec: sources.SourceSpec, plan: Plan, model_dir: ModelDir) -> dict[str, Any]:
    manifest = manifest_sha256(model_dir)
    return {
        "engine": "ray",
        "input": str(cfg.input),
        "input_fingerprint": sources.fingerprint(cfg.input),
        "rows": plan.rows,
        "format": spec.format,
        "id_field": spec.id_field,
        "text_field": spec.text_field,
        "chunk_size": cfg.chunk_size,
        "model": model_dir.manifest.name,
        "manifest_sha256": manifest,
        "device": cfg.device,
        "variant": cfg.variant,
        "normalize": cfg.normalize,
        "dimensions": cfg.dimensions,
        "dtype": cfg.dtype,
    }


def _run(cfg: RayJobConfig, plan: Plan, todo: list[int], job: ActorJob) -> None:
    import ray
    import ray.data

    if not ray.is_initialized():  # a caller (a test, a notebook) may have joined a cluster already
        ray.init(address=cfg.ray_address, include_dashboard=False)
    actors = _actor_count(cfg, ray.cluster_resources())
    resources = {"num_gpus": 1} if cfg.device == "cuda" else {"num_cpus": cfg.threads}
    ray.data.DataContext.get_current().enable_progress_bars = cfg.progress
    # Reads are cheap next to embedding: no CPU reserved (the actors hold them all), a few at a time.
    ds = ray.data.read_datasource(
        ChunkSource(plan, todo, cfg.skip_bad), num_cpus=0, concurrency=actors, override_num_blocks=len(todo)
    )
    ds = ds.map_batches(
        EmbedActor,
        fn_constructor_args=(job,),
        batch_size=None,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=actors),
        **resources,
    )
    log.info(
        "%d chunks to do on %d actors (%s each), batches of %d rows",
        len(todo),
        actors,
        "1 GPU" if cfg.device == "cuda" else f"{cfg.threads} CPU",
        cfg.batch_size,
    )
    shown, engines = 0, set()
    try:
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            for row in batch.to_pylist():
                if (row["variant"], row["provider"]) not in engines:
                    engines.add((row["variant"], row["provider"]))
                    log.info("an actor runs the %s graph on %s", row["variant"], row["provider"])
                if row["bad_lines"] and shown < SHOWN_BAD_LINES:
                    shown += 1
                    log.warning(
                        "skipped %d bad lines in chunk %d, the first: %s",
                        row["bad_lines"],
                        row["chunk"],
                        row["first_bad"],
                    )
    except Exception as e:  # Ray wraps what a task raised; the job's own errors are shown plainly
        cause = _job_error(e)
        if cause is None:
            raise
        raise cause from None


def _actor_count(cfg: RayJobConfig, cluster: dict[str, float]) -> int:
    if cfg.device == "cuda":
        gpus = int(cluster.get("GPU", 0))
        if gpus < max(cfg.num_actors, 1):
            raise ProviderError(
                f"--device cuda: each actor takes one GPU; the Ray cluster has {gpus} "
                f"(resources: {dict(sorted(cluster.items()))})"
            )
        return cfg.num_actors or gpus
    cpus = int(cluster.get("CPU", 1))
    actors = cfg.num_actors or max(1, cpus // cfg.threads)
    if actors * cfg.threads > cpus:
        log.warning(
            "%d actors x %d threads need %d CPUs; the cluster has %d now: the rest wait for more nodes",
            actors,
            cfg.threads,
            actors * cfg.threads,
            cpus,
        )
    return actors


def _job_error(error: BaseException | None) -> BaseException | None:
    """The job's own error inside what Ray raised (its cause chain), if there is one."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "actor_init_failed", False):  # RayActorError: only the message survives
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return ActorFailed(f"an actor could not start: {lines[-1] if lines else error}")
        if isinstance(error, JOB_ERRORS):  # a RayTaskError posing as the error carries the original
            cause = getattr(error, "cause", None)
            return cause if isinstance(cause, JOB_ERRORS) else error
        error = error.__cause__ or error.__context__
    return None
