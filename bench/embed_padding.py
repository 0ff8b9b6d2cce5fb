"""What padding costs encoder batches, and what packed rows give back: one run, sides alternated.

Through a real `python -m service` (16 concurrent clients x 1 input per call), for the embedding
and fill-mask models, packed (the default) and padded (`--embed-pack-row-tokens 0`): useful
tokens/s on mixed lengths and on uniform lengths of the same mean, server CPU per 1,000 input
tokens, and the padding computed (`ts_batch_padding_ratio`). Beside them, each in its own process:
onnxruntime alone on length-sorted padded and packed batches (the ceiling) and
sentence-transformers' best batch size (MiniLM only). Texts: seeded windows of 5-60 words from the
repository's held-out texts; fill-mask texts get one [MASK].

    python -m bench.embed_padding --models models [--sentences 1000] [--clients 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, ServiceProcess, conditions, emit, run_worker, scrape_histogram, summary
from bench.procstat import cpu_seconds

SOURCES = (("checkpoints/tinystories-gpt/heldout.jsonl", "text"), ("checkpoints/mlm-encoder/heldout.jsonl", "text"))
WORKER = "bench.embed_padding"


def texts(tokenizer_file: Path, count: int, uniform: bool, mask: str | None, seed: int = 0) -> list[str]:
    """count windows of 5-60 words (mixed), or of the mixed mean's token count (uniform)."""
    from tokenizers import Tokenizer

    words = [
        w
        for path, key in SOURCES
        for line in (ROOT / path).read_text(encoding="utf-8").splitlines()
        for w in json.loads(line)[key].split()
    ]
    rng = random.Random(seed)

    def window(n: int) -> str:
        start = rng.randrange(0, len(words) - n)
        chosen = words[start : start + n]
        if mask:
            chosen[rng.randrange(n)] = mask
        return " ".join(chosen)

    tok = Tokenizer.from_file(str(tokenizer_file))
    mixed = [window(rng.randint(5, 60)) for _ in range(count)]
    if not uniform:
        return mixed
    mean = round(statistics.mean(len(e.ids) for e in tok.encode_batch(mixed)))
    out: list[str] = []
    while len(out) < count:
        candidates = [window(rng.randint(max(3, mean // 2 - 5), mean)) for _ in range(200)]
        out += [t for t, e in zip(candidates, tok.encode_batch(candidates)) if abs(len(e.ids) - mean) <= 1]
    return out[:count]


# ---- workers (each side in its own process) -------------------------------------------------------


async def _clients(address: str, kind: str, model: str, items: list[str], clients: int) -> float:
    import grpc

    from service.proto import inference_pb2 as pb
    from service.proto import inference_pb2_grpc as pb_grpc

    queue: asyncio.Queue = asyncio.Queue()
    async with grpc.aio.insecure_channel(address) as channel:
        if kind == "embedding":
            embed_stub = pb_grpc.EmbeddingServiceStub(channel)

            def call(text):
                return embed_stub.Embed(pb.EmbedRequest(model=model, inputs=[text]), timeout=120)
        else:
            mask_stub = pb_grpc.FillMaskServiceStub(channel)

            def call(text):
                return mask_stub.FillMask(pb.FillMaskRequest(model=model, inputs=[text], top_k=5), timeout=120)

        async def client() -> None:
            while not queue.empty():
                await call(queue.get_nowait())

        for text in items[: clients * 2]:  # warm-up
            queue.put_nowait(text)
        await asyncio.gather(*(client() for _ in range(clients)))
        for text in items:
            queue.put_nowait(text)
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - start


def client_side(args) -> dict:
    items = json.loads(Path(args.texts).read_text())
    cpu = cpu_seconds(args.server_pid)
    before = scrape_histogram(args.metrics_url, "ts_batch_padding_ratio")
    wall = asyncio.run(_clients(args.address, args.kind, args.model, items, args.clients))
    cpu = cpu_seconds(args.server_pid) - cpu
    after = scrape_histogram(args.metrics_url, "ts_batch_padding_ratio")
    count = after.get("count", 0) - before.get("count", 0)
    ratio = (after.get("sum", 0) - before.get("sum", 0)) / count if count else None
    return {"wall_s": wall, "cpu_s": cpu, "padding_ratio_mean": ratio}


def ort_side(args) -> dict:
    """onnxruntime alone: offline-sorted padded batches of 16, or packed rows, of the served graph."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from service.engine.packing import pack
    from service.manifest import load_model_dir

    model_dir = load_model_dir(args.model_dir)
    m = model_dir.manifest
    graph = m.graph(args.role, args.variant)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    sess = ort.InferenceSession(str(model_dir.file(graph.file)), opts, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(str(model_dir.file(m.tokenizer["file"])))
    tok.enable_truncation(m.max_input_tokens)
    seqs = sorted((e.ids for e in tok.encode_batch(json.loads(Path(args.texts).read_text()))), key=len)
    pad, names = int(m.special_tokens.get("pad", 0)), [i.name for i in sess.get_inputs()]
    mask_id = m.special_tokens.get("mask")

    def run(batch):
        if args.role == "packed":
            p = pack(batch, max(args.row_tokens, max(map(len, batch))), pad)
            feeds = {"input_ids": p.input_ids, "position_ids": p.position_ids, "segment_ids": p.segment_ids}
            if "gather_positions" in names:
                feeds["gather_positions"] = np.flatnonzero(p.input_ids.reshape(-1) == mask_id)
        else:
            ids = np.full((len(batch), max(map(len, batch))), pad, np.int64)
            mask = np.zeros_like(ids)
            for r, s in enumerate(batch):
                ids[r, : len(s)], mask[r, : len(s)] = s, 1
            feeds = {"input_ids": ids, "attention_mask": mask}
        sess.run(None, feeds)

    batches = [seqs[i : i + 16] for i in range(0, len(seqs), 16)]
    run(batches[0])
    start = time.perf_counter()
    for b in batches:
        run(b)
    return {"wall_s": time.perf_counter() - start, "tokens": sum(map(len, seqs))}


def st_side(args) -> dict:
    from bench.embed_throughput import sentence_transformers_run

    items = json.loads(Path(args.texts).read_text())
    best = min((sentence_transformers_run(items, bs, args.threads)[0], bs) for bs in (8, 16, 32))
    return {"wall_s": best[0], "batch_size": best[1]}


# ---- orchestration --------------------------------------------------------------------------------


def served(models: Path, flags: list[str], kind: str, model: str, text_files: dict, args) -> dict:
    service = ServiceProcess(models, ["--intra-op-threads", str(args.threads), *flags], metrics=True)
    try:
        out = {}
        for shape, path in text_files.items():
            out[shape] = run_worker(
                WORKER,
                "client",
                "--address",
                service.address,
                "--metrics-url",
                service.metrics_url,
                "--server-pid",
                str(service.proc.pid),
                "--kind",
                kind,
                "--model",
                model,
                "--texts",
                str(path),
                "--clients",
                str(args.clients),
            )
        return out
    finally:
        service.stop()


def tokens_of(tokenizer_file: Path, path: Path, limit: int) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.enable_truncation(limit)
    return sum(len(e.ids) for e in tok.encode_batch(json.loads(path.read_text())))


def bench_kind(kind: str, model: str, args, tmp: Path) -> dict:
    from service.manifest import load_model_dir

    model_dir = load_model_dir(args.models / model)
    m = model_dir.manifest
    tokenizer_file = model_dir.file(m.tokenizer["file"])
    mask = "[MASK]" if kind == "fill-mask" else None
    files, tokens = {}, {}
    for shape in ("mixed", "uniform"):
        files[shape] = tmp / f"{kind}-{shape}.json"
        files[shape].write_text(json.dumps(texts(tokenizer_file, args.sentences, shape == "uniform", mask)))
        tokens[shape] = tokens_of(tokenizer_file, files[shape], m.max_input_tokens)
    variant = (
        next(v for v in ("int8", "optimized", "fp32") if v in m.variants("packed"))
        if args.variant == "auto"
        else args.variant
    )
    rounds = []
    for _ in range(args.rounds):
        r = {
            "packed": served(args.models, ["--variant", variant], kind, model, files, args),
            "padded": served(
                args.models, ["--variant", variant, "--embed-pack-row-tokens", "0"], kind, model, files, args
            ),
        }
        common = [
            "--model-dir",
            str(args.models / model),
            "--variant",
            variant,
            "--texts",
            str(files["mixed"]),
            "--threads",
            str(args.threads),
            "--row-tokens",
            str(args.row_tokens),
        ]
        r["ort_sorted_padded"] = run_worker(WORKER, "ort", "--role", "encoder", *common)
        r["ort_packed"] = run_worker(WORKER, "ort", "--role", "packed", *common)
        if kind == "embedding" and model == "all-minilm-l6-v2":
            r["sentence_transformers"] = run_worker(
                WORKER, "st", "--texts", str(files["mixed"]), "--threads", str(args.threads)
            )
        rounds.append(r)
    return report(rounds, tokens, variant)


def report(rounds: list[dict], tokens: dict, variant: str) -> dict:
    def rate(r, shape):
        return tokens[shape] / r["wall_s"]

    out: dict[str, Any] = {"variant": variant, "input_tokens": tokens}
    for mode in ("packed", "padded"):
        out[mode] = {
            f"{shape}_tokens_per_s": summary([rate(r[mode][shape], shape) for r in rounds], 0)
            for shape in ("mixed", "uniform")
        }
        out[mode]["mixed_over_uniform"] = summary(
            [rate(r[mode]["mixed"], "mixed") / rate(r[mode]["uniform"], "uniform") for r in rounds]
        )
        for shape in ("mixed", "uniform"):
            out[mode][f"{shape}_cpu_s_per_1000_tokens"] = summary(
                [1000 * r[mode][shape]["cpu_s"] / tokens[shape] for r in rounds], 3
            )
            out[mode][f"{shape}_padding_ratio"] = rounds[-1][mode][shape]["padding_ratio_mean"]
    ceiling = [tokens["mixed"] / r["ort_sorted_padded"]["wall_s"] for r in rounds]
    out["ort_sorted_padded_tokens_per_s"] = summary(ceiling, 0)
    out["ort_packed_tokens_per_s"] = summary([tokens["mixed"] / r["ort_packed"]["wall_s"] for r in rounds], 0)
    out["packed_over_ort_sorted"] = summary([rate(r["packed"]["mixed"], "mixed") / c for r, c in zip(rounds, ceiling)])
    out["packed_over_padded_mixed"] = summary(
        [rate(r["packed"]["mixed"], "mixed") / rate(r["padded"]["mixed"], "mixed") for r in rounds]
    )
    if "sentence_transformers" in rounds[0]:
        st = [tokens["mixed"] / r["sentence_transformers"]["wall_s"] for r in rounds]
        out["sentence_transformers_tokens_per_s"] = summary(st, 0)
        out["sentence_transformers_batch_size"] = rounds[-1]["sentence_transformers"]["batch_size"]
        out["packed_over_sentence_transformers"] = summary(
            [rate(r["packed"]["mixed"], "mixed") / s for r, s in zip(rounds, st)]
        )
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {WORKER}", description=__doc__.split("\n")[0])
    p.add_argument("side", nargs="?", choices=["client", "ort", "st"], help=argparse.SUPPRESS)
    p.add_argument("--models", type=Path, default=Path("models"))
    p.add_argument("--embedding-model", default="all-minilm-l6-v2")
    p.add_argument("--fill-mask-model", default="mlm-encoder")
    p.add_argument("--only", default="embedding,fill-mask")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--row-tokens", type=int, default=128, help="the served embed_pack_row_tokens")
    p.add_argument("--variant", default="auto", help="auto: int8 when the packed graph has it, else optimized")
    for name in ("--address", "--metrics-url", "--kind", "--model", "--texts", "--model-dir", "--role"):
        p.add_argument(name)
    p.add_argument("--server-pid", type=int)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.side:
        emit({"client": client_side, "ort": ort_side, "st": st_side}[args.side](args))
        return 0
    import tempfile

    before, result = conditions(), {}
    with tempfile.TemporaryDirectory(prefix="bench-padding-") as tmp:
        for kind, model in (("embedding", args.embedding_model), ("fill-mask", args.fill_mask_model)):
            if kind in args.only.split(","):
                result[kind] = bench_kind(kind, model, args, Path(tmp))
    result["conditions"] = {
        "before": before,
        "after": conditions(),
        "threads": args.threads,
        "clients": args.clients,
        "rounds": args.rounds,
    }
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
