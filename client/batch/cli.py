"""Command line of the batch embedding job: `ts-embed-batch INPUT --output OUT ...` (= `python -m client.batch`).

`--engine grpc` (the default, this module): through a running service's EmbedStream.
`--engine ray`: Ray Data and an actor pool running the model in-process (client/batch/ray_cli.py).

Also reachable as `python -m client [--address A] batch ...` through
`add_batch_parser(subparsers)` (there the client's global --address is used). pyarrow and tqdm
(the `batch` extra) are imported only when a job runs, so the client CLI works without them.
Exit codes: 0 done (per-item failures are listed in `<output>.failures.jsonl`, not fatal),
1 the job failed (server unreachable after retries, unknown model, unreadable input, a work
folder of another job), 2 bad flags.

Sharding: `--shard-index` defaults to $JOB_COMPLETION_INDEX (set by a Kubernetes Indexed Job);
`--output` may contain `{shard}` / `{shards}` (str.format fields, e.g. `out-{shard:05d}.parquet`);
without them, a sharded run appends `-SSSSS-of-NNNNN` to the file name.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from client import args as types
from client import channel as channels
from client.batch.embedder import BatchFailed, EmbedOptions
from client.batch.sources import FORMATS, InputError

if TYPE_CHECKING:
    from client.batch.runner import JobConfig
    from client.clients import Client

log = logging.getLogger("client.batch")

OUTPUT_SUFFIXES = (".parquet", ".npy")
DTYPE_CHOICES = ("float16", "float32")  # client.batch.store.DTYPES
DEFAULT_ADDRESS = "127.0.0.1:50051"
ENGINES = ("grpc", "ray")


def add_arguments(parser: argparse.ArgumentParser, address: bool = True) -> None:
    io = parser.add_argument_group("input and output")
    io.add_argument("input", type=Path, help="text lines (.txt), JSON lines (.jsonl) or Parquet (.parquet)")
    io.add_argument("--output", required=True, help="output file, .parquet (id + embedding) or .npy (+ .ids.npy)")
    io.add_argument("--format", choices=FORMATS, default=None, help="input format (default: from the extension)")
    io.add_argument("--id-field", default="id", help="JSONL field / Parquet column of the id (default id)")
    io.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text (default text)")
    io.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32", help="stored vector type (default float32)")
    io.add_argument("--restart", action="store_true", help="discard a previous run's parts instead of resuming")
    srv = parser.add_argument_group("server and model")
    if address:  # under the client CLI, its global --address and security flags apply
        srv.add_argument(
            "--address",
            default=os.environ.get("TS_ADDRESS", DEFAULT_ADDRESS),
            help=f"gRPC target: host:port or dns:///svc-headless:50051 (env TS_ADDRESS; {DEFAULT_ADDRESS})",
        )
        channels.add_arguments(parser)  # --token, --tls-ca, ... (TS_TOKEN, TS_TLS_CA, ...)
    srv.add_argument("--model", default="", help="embedding model (default: the server's default)")
    srv.add_argument("--dimensions", type=int, default=0, help="keep the first N values (0: all)")
    srv.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None, help="L2-normalise")
    srv.add_argument(
        "--truncate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="truncate long texts (--no-truncate: they are recorded as failures)",
    )
    run = parser.add_argument_group("throughput and retries")
    run.add_argument("--batch-size", type=int, default=32, help="texts per request (default 32)")
    run.add_argument("--chunk-size", type=int, default=1024, help="texts per chunk = per part file (default 1024)")
    run.add_argument("--concurrency", type=int, default=4, help="streams in flight, one chunk each (default 4)")
    run.add_argument("--window", type=int, default=4, help="requests awaiting a response per stream (default 4)")
    run.add_argument("--max-retries", type=int, default=8, help="retries in a row without progress (default 8)")
    run.add_argument("--chunk-timeout", type=float, default=600.0, help="deadline of one chunk's stream, seconds")
    run.add_argument("--shard-index", type=int, default=None, help="this shard (default $JOB_COMPLETION_INDEX or 0)")
    run.add_argument("--shard-count", type=int, default=1, help="number of shards (default 1)")
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bar (--no-progress: a log line every 30 s)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def add_batch_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`batch` subcommand of the client CLI: `handler(args, client)` runs the job at client.address."""
    parser = subparsers.add_parser("batch", help="embed a large file (resumable, sharded; docs/deploy.md)")
    add_arguments(parser, address=False)
    parser.set_defaults(handler=client_handler)
    return parser


def client_handler(args: argparse.Namespace, client: Client) -> int:
    args.address, args.credentials = client.address, client.credentials
    return main_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = types.Parser(
        prog="ts-embed-batch",
        description="Embed a large file through the service's EmbedStream (resumable, sharded); see docs/deploy.md.",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="grpc",
        help="grpc: through a running service (these flags); ray: on a Ray cluster, no server "
        "(ts-embed-batch --engine ray --help)",
    )
    add_arguments(parser)
    return parser


def job_config(args: argparse.Namespace) -> JobConfig:
    """Validates flags into a JobConfig; raises ValueError with the reason."""
    shard_index = args.shard_index
    if shard_index is None:
        shard_index = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    if args.shard_count < 1 or not 0 <= shard_index < args.shard_count:
        raise ValueError(f"--shard-index {shard_index} must be in [0, --shard-count {args.shard_count})")
    for name in ("batch_size", "chunk_size", "concurrency", "window"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_retries < 0 or args.dimensions < 0 or args.chunk_timeout <= 0:
        raise ValueError("--max-retries and --dimensions must be >= 0, --chunk-timeout > 0")
    output = Path(shard_output(args.output, shard_index, args.shard_count))
    if output.suffix not in OUTPUT_SUFFIXES:
        raise ValueError(f"--output {output}: must end in {' or '.join(OUTPUT_SUFFIXES)}")
    embed = EmbedOptions(
        model=args.model,
        normalize=args.normalize,
        truncate=args.truncate,
        dimensions=args.dimensions,
        batch_size=args.batch_size,
        window=args.window,
        max_retries=args.max_retries,
        timeout=args.chunk_timeout,
    )
    from client.batch.runner import JobConfig

    credentials = getattr(args, "credentials", None) or channels.Credentials.from_args(args)
    return JobConfig(
        input=args.input,
        output=output,
        address=args.address,
        credentials=credentials,
        format=args.format,
        id_field=args.id_field,
        text_field=args.text_field,
        dtype=args.dtype,
        chunk_size=args.chunk_size,
        concurrency=args.concurrency,
        shard_index=shard_index,
        shard_count=args.shard_count,
        restart=args.restart,
        progress=args.progress,
        embed=embed,
    )


def shard_output(template: str, shard: int, shards: int) -> str:
    """The output path of one shard: fills {shard}/{shards}, or appends -SSSSS-of-NNNNN when sharded."""
    if "{" in template:
        try:
            return template.format(shard=shard, shards=shards)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"--output {template!r}: only {{shard}} and {{shards}} may be used ({e})") from e
    if shards == 1:
        return template
    path = Path(template)
    return str(path.with_name(f"{path.stem}-{shard:05d}-of-{shards:05d}{path.suffix}"))


def main_args(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg = job_config(args)
    except ValueError as e:
        log.error("%s", e)
        return 2
    from client.batch.runner import run_job
    from client.batch.store import LedgerMismatch

    try:
        summary = asyncio.run(run_job(cfg))
    except (BatchFailed, InputError, LedgerMismatch, OSError) as e:
        log.error("batch job failed: %s", e)
        return 1
    if summary.failed:
        log.warning("%d items failed; see %s", summary.failed, summary.failures_file)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`ts-embed-batch` and `python -m client.batch`: the engine chosen by --engine."""
    argv = sys.argv[1:] if argv is None else argv
    engine = types.Parser(prog="ts-embed-batch", add_help=False)
    engine.add_argument("--engine", choices=ENGINES, default="grpc")
    if engine.parse_known_args(argv)[0].engine == "ray":
        from client.batch import ray_cli

        return ray_cli.main(argv)
    return main_args(build_parser().parse_args(argv))
