"""Batch embedding of one file, three ways, side by side: texts/s of
1. `ts-embed-batch --engine ray`: a local Ray cluster of --cpus CPUs, --actors actors x 1 onnxruntime
   thread, the model in-process (client/batch/ray_job.py);
2. `ts-embed-batch --engine grpc` against `python -m service` (subprocess, its default 2 compute
   workers x 1 thread) on this machine: the batch client over EmbedStream;
3. sentence-transformers in-process (PyTorch, batches of --st-batch-size), once per --st-threads
   value (default 1 and 2: on a busy 2-core machine torch's 2-thread pool can fall far below 1 thread).

Each side runs in its own worker process (bench/common.py). Ray's figure is the job's wall time
(actor start and model load included; `ray.init` apart) and, beside it, the steady rate between
the first and the last part committed. The gRPC figure leaves out the service's start. Vectors are
compared by id (min cosine against sentence-transformers). Sentences: STS-B (bench.embed_throughput).

    python -m bench.batch_engines --models models --sentences 4000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads

from bench.common import ServiceProcess, conditions, emit, run_worker, summary
from bench.embed_throughput import load_sentences

log = logging.getLogger("bench.batch_engines")


def ray_worker(args: argparse.Namespace) -> dict:
    import ray

    from client.batch.ray_job import RayJobConfig, run_ray_job

    start = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False)
    init_s = time.perf_counter() - start
    cfg = RayJobConfig(
        input=args.corpus,
        output=args.output,
        models=args.models,
        model=args.model,
        num_actors=args.actors,
        threads=1,
        batch_size=args.batch_size,
        chunk_size=args.chunk_size,
        restart=True,
        progress=False,
    )
    start = time.perf_counter()
    result = run_ray_job(cfg)
    job_s = time.perf_counter() - start
    ray.shutdown()
    # Steady rate: the parts after each actor's first, over the time from the last of those firsts.
    parts = sorted(args.output.glob("part-*.parquet"), key=lambda p: p.stat().st_mtime)
    start, end = parts[args.actors - 1].stat().st_mtime, parts[-1].stat().st_mtime
    later_rows = sum(pads.dataset(p).count_rows() for p in parts[args.actors :])
    return {
        "ray_init_s": round(init_s, 2),
        "job_s": round(job_s, 2),
        "texts_per_s": round(result.rows / job_s, 1),
        "steady_texts_per_s": round(later_rows / max(end - start, 1e-9), 1),
        "parts": len(parts),
    }


def grpc_worker(args: argparse.Namespace) -> dict:
    from client.batch.embedder import EmbedOptions
    from client.batch.runner import JobConfig, run_job

    cfg = JobConfig(
        input=args.corpus,
        output=args.output,
        address=args.address,
        chunk_size=args.chunk_size,
        restart=True,
        progress=False,
        embed=EmbedOptions(model=args.model, batch_size=args.batch_size),
    )
    start = time.perf_counter()
    result = asyncio.run(run_job(cfg))
    job_s = time.perf_counter() - start
    return {"job_s": round(job_s, 2), "texts_per_s": round(result.rows / job_s, 1), "failed": result.failed}


def st_worker(args: argparse.Namespace) -> dict:
    from bench.embed_throughput import sentence_transformers_run

    records = [json.loads(line) for line in args.corpus.read_text(encoding="utf-8").splitlines()]
    threads = args.st_threads[0]
    seconds, vectors = sentence_transformers_run([r["text"] for r in records], args.st_batch_size, threads)
    np.save(args.output, vectors)
    return {
        "encode_s": round(seconds, 2),
        "texts_per_s": round(len(records) / seconds, 1),
        "batch_size": args.st_batch_size,
        "threads": threads,
    }


WORKERS = {"ray": ray_worker, "grpc": grpc_worker, "st": st_worker}


def vectors_by_id(path: Path) -> dict[str, np.ndarray]:
    table = pads.dataset(path, format="parquet").to_table()
    return dict(zip(table.column("id").to_pylist(), np.array(table.column("embedding").to_pylist(), np.float32)))


def min_cosine(a: dict[str, np.ndarray], ids: list[str], b: np.ndarray) -> float:
    x = np.stack([a[i] for i in ids])  # (N, D), in corpus order
    return float(((x * b).sum(axis=1) / np.linalg.norm(x, axis=1) / np.linalg.norm(b, axis=1)).min())


def orchestrate(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="batch-engines-"))
    corpus = work / "corpus.jsonl"
    sentences = load_sentences(args.data, args.sentences)
    ids = [f"s{i}" for i in range(len(sentences))]
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, sentences)))
    common = [
        "--corpus",
        str(corpus),
        "--models",
        str(args.models),
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--chunk-size",
        str(args.chunk_size),
    ]
    before = conditions()
    runs: dict[str, list[dict]] = {"ray": [], "grpc": [], **{f"st{t}": [] for t in args.st_threads}}
    for _ in range(args.rounds):
        runs["ray"].append(
            run_worker(
                "bench.batch_engines",
                "--worker",
                "ray",
                *common,
                "--output",
                str(work / "ray"),
                "--actors",
                str(args.actors),
                "--cpus",
                str(args.cpus),
            )
        )
        service = ServiceProcess(args.models, [f for flag in args.server_flag for f in flag.split()])
        try:
            runs["grpc"].append(
                run_worker(
                    "bench.batch_engines",
                    "--worker",
                    "grpc",
                    *common,
                    "--output",
                    str(work / "grpc.parquet"),
                    "--address",
                    service.address,
                )
            )
        finally:
            service.stop()
        served = [line.split(": ", 1)[-1] for line in service.log if "embedding model" in line or "variant=" in line]
        for threads in args.st_threads:
            runs[f"st{threads}"].append(
                run_worker(
                    "bench.batch_engines",
                    "--worker",
                    "st",
                    *common,
                    "--output",
                    str(work / "st.npy"),
                    "--st-batch-size",
                    str(args.st_batch_size),
                    "--st-threads",
                    str(threads),
                )
            )
    reference = np.load(work / "st.npy")
    result = {
        "sentences": len(sentences),
        "model": args.model,
        "models": str(args.models),
        "conditions_before": before,
        "conditions_after": conditions(),
        "ray": {
            **runs["ray"][-1],
            "texts_per_s": summary([r["texts_per_s"] for r in runs["ray"]], 1),
            "steady_texts_per_s": summary([r["steady_texts_per_s"] for r in runs["ray"]], 1),
            "actors": args.actors,
            "threads_per_actor": 1,
            "cpus": args.cpus,
        },
        "grpc": {
            **runs["grpc"][-1],
            "texts_per_s": summary([r["texts_per_s"] for r in runs["grpc"]], 1),
            "served": served,
        },
        **{
            f"sentence_transformers_{t}_threads": {
                **runs[f"st{t}"][-1],
                "texts_per_s": summary([r["texts_per_s"] for r in runs[f"st{t}"]], 1),
            }
            for t in args.st_threads
        },
        "min_cosine_vs_st": {
            "ray": min_cosine(vectors_by_id(work / "ray"), ids, reference),
            "grpc": min_cosine(vectors_by_id(work / "grpc.parquet"), ids, reference),
        },
    }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batch_engines", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=Path, default=Path("models"), help="models root (must hold MiniLM)")
    p.add_argument("--model", default="all-minilm-l6-v2", help="embedding model name")
    p.add_argument("--data", type=Path, default=None, help="sentences file (default: STS-B dev + train)")
    p.add_argument("--sentences", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (Ray) / per request (gRPC)")
    p.add_argument("--chunk-size", type=int, default=256, help="texts per chunk = per part file")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    p.add_argument("--st-batch-size", type=int, default=8, help="sentence-transformers batch size (8: its best here)")
    p.add_argument("--st-threads", type=int, nargs="+", default=[1, 2], help="torch threads for sentence-transformers")
    p.add_argument("--server-flag", action="append", default=[], help="extra `python -m service` flag (repeatable)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the three sides, in turn")
    p.add_argument("--worker", choices=WORKERS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--address", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.worker:
        emit(WORKERS[args.worker](args))
        return 0
    sys.stdout.write(json.dumps(orchestrate(args), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
