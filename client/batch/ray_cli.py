"""Flags of `ts-embed-batch --engine ray` (client/batch/ray_job.py); `cli.main` dispatches here.

    ts-embed-batch --engine ray corpus.jsonl --output embeddings/ --models models [--num-actors 4]

Ray (the `ray` extra: `pip install '.[ray]'`) is imported only when a job runs. Exit codes as the
gRPC engine's: 0 done, 1 the job failed (bad input line without --skip-bad, unknown model, no
CUDA, an output folder of another job, Ray failures), 2 bad flags.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from client import args as types
from client.batch.local import VARIANT_CHOICES
from client.batch.sources import FORMATS

if TYPE_CHECKING:
    from client.batch.ray_job import RayJobConfig

log = logging.getLogger("client.batch")

DTYPE_CHOICES = ("float16", "float32")  # client.batch.parts.DTYPES


def build_parser() -> argparse.ArgumentParser:
    parser = types.Parser(
        prog="ts-embed-batch --engine ray",
        description="Embed a large file on a Ray cluster: Ray Data reads it, an actor pool runs the model "
        "in-process (no server), part files are committed as chunks finish (resumable, each id "
        "once); see docs/deploy.md.",
    )
    parser.add_argument("--engine", choices=("grpc", "ray"), default="ray", help="ray here")
    io = parser.add_argument_group("input and output")
    io.add_argument("input", type=Path, help="text lines (.txt), JSON lines (.jsonl) or Parquet (.parquet)")
    io.add_argument(
        "--output",
        type=Path,
        required=True,
        help="output folder: part-NNNNNNNN.parquet files (columns id, embedding) and _SUCCESS",
    )
    io.add_argument("--format", choices=FORMATS, default=None, help="input format (default: from the extension)")
    io.add_argument("--id-field", default="id", help="JSONL field / Parquet column of the id (default id)")
    io.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text (default text)")
    io.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32", help="stored vector type (default float32)")
    io.add_argument("--restart", action="store_true", help="discard a previous run's parts instead of resuming")
    io.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip (and count) lines that are not JSON or lack the id or text, instead of stopping",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--models",
        type=Path,
        default=Path(os.environ.get("TS_MODELS", "models")),
        help="folder of model directories, or one model directory (env TS_MODELS; models)",
    )
    model.add_argument("--model", default="", help="embedding model name (default: the service's default)")
    model.add_argument(
        "--variant",
        choices=VARIANT_CHOICES,
        default="auto",
        help="graph variant (default auto: the one the service would serve on this device)",
    )
    model.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu, or cuda: one GPU per actor, onnxruntime-gpu required (no silent CPU fallback)",
    )
    model.add_argument("--dimensions", type=int, default=0, help="keep the first N values (0: all)")
    model.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="L2-normalise (default: yes, as the service)",
    )
    ray = parser.add_argument_group("Ray")
    ray.add_argument(
        "--ray-address",
        default=None,
        help="cluster to join, e.g. ray://head:10001 or auto (default: $RAY_ADDRESS, else a local "
        "cluster on this machine's cores)",
    )
    ray.add_argument(
        "--num-actors",
        type=int,
        default=0,
        help="model copies (default: the cluster's CPUs / --threads; its GPUs with --device cuda)",
    )
    ray.add_argument("--threads", type=int, default=1, help="onnxruntime threads (and CPUs) per actor (default 1)")
    ray.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    ray.add_argument(
        "--chunk-size",
        type=int,
        default=1024,
        help="lines per Ray block = per part file = unit of resumption (default 1024)",
    )
    ray.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="Ray Data's progress display"
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return parser


def job_config(args: argparse.Namespace) -> RayJobConfig:
    """Validates flags into a RayJobConfig; raises ValueError with the reason."""
    for name in ("threads", "batch_size", "chunk_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_actors < 0 or args.dimensions < 0:
        raise ValueError("--num-actors and --dimensions must be >= 0")
    from client.batch.ray_job import RayJobConfig

    return RayJobConfig(
        input=args.input,
        output=args.output,
        models=args.models,
        model=args.model,
        variant=args.variant,
        format=args.format,
        id_field=args.id_field,
        text_field=args.text_field,
        dtype=args.dtype,
        normalize=args.normalize,
        dimensions=args.dimensions,
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        num_actors=args.num_actors,
        threads=args.threads,
        device=args.device,
        ray_address=args.ray_address,
        restart=args.restart,
        skip_bad=args.skip_bad,
        progress=args.progress,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if importlib.util.find_spec("ray") is None:
        log.error("--engine ray needs Ray Data: pip install 'transformer-serving[ray]' (or '.[ray]' in a checkout)")
        return 1
    try:
        cfg = job_config(args)
    except ValueError as e:
        log.error("%s", e)
        return 2
    from client.batch.parts import Incomplete, JobMismatch
    from client.batch.ray_job import JOB_ERRORS, run_ray_job

    try:
        run_ray_job(cfg)
    except (*JOB_ERRORS, JobMismatch, Incomplete, OSError) as e:
        log.error("batch job failed: %s", e)
        return 1
    return 0
