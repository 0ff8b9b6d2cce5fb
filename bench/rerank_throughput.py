"""Rerank pairs/s: the service vs sentence-transformers' CrossEncoder.predict vs onnxruntime alone.

1. Builds a cross-encoder folder (random weights, BERT shape from --layers / --hidden; a WordPiece
   vocabulary trained on the sentences; saved by CrossEncoder) and converts it (the optimized
   variant, and --variant's), unless --root names an earlier run's.
2. Rounds, each running the three sides one after the other, alternating their order (each side in
   its own process: two thread pools in one process spin against each other):
   - service: `python -m service --variant V`, --clients concurrent Rerank calls of 1 query x
     --documents documents;
   - cross-encoder: `CrossEncoder.predict` on the same pairs at each --st-batch-size (its best kept);
   - onnxruntime: the served graph alone (the manifest's padded graph of --variant, one session of
     --threads threads), the same pairs tokenized, length-sorted batches of --ort-batch pairs.
Prints one JSON object: pairs/s and CPU seconds per 1,000 pairs (the service's whole process tree,
from /proc; the others' own process time) per side and round, the server's CPU seconds per call,
their medians and ratios, the machine and its load. On a shared, loaded machine the CPU figures are the ones to compare.

    python -m bench.rerank_throughput --layers 12 --hidden 768 --calls 64 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ServiceProcess, conditions, emit, run_worker, summary
from bench.embed_throughput import load_sentences
from bench.procstat import cpu_seconds


def calls(sentences: list[str], count: int, documents: int) -> list[tuple[str, list[str]]]:
    """count (query, documents) calls drawn from the sentences in order, wrapping around."""
    out = []
    for i in range(count):
        start = (i * (documents + 1)) % max(1, len(sentences) - documents - 1)
        out.append((sentences[start], sentences[start + 1 : start + 1 + documents]))
    return out


def build(root: Path, sentences: list[str], layers: int, hidden: int, variant: str) -> tuple[Path, Path]:
    """A CrossEncoder folder (root/hf) and its conversion (root/models/cross-encoder)."""
    from sentence_transformers import CrossEncoder
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    from export.convert import convert

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(sentences, trainers.WordPieceTrainer(vocab_size=8000, special_tokens=specials))
    raw = root / "raw"
    raw.mkdir(parents=True)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (raw / "vocab.txt").write_text("".join(f"{t}\n" for t, _ in vocab), encoding="utf-8")
    BertTokenizer(str(raw / "vocab.txt")).save_pretrained(raw)
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden,
    )
    cfg.num_labels = 1
    BertForSequenceClassification(cfg).save_pretrained(raw)
    CrossEncoder(str(raw), local_files_only=True, max_length=256).save(str(root / "hf"))
    variants = ("optimized",) if variant in ("fp32", "optimized") else ("optimized", variant)
    convert(root / "hf", root / "models" / "cross-encoder", name="cross-encoder", variants=variants)
    return root / "hf", root / "models"


async def _service_run(address: str, pid: int, work: list, clients: int) -> tuple[float, float]:
    """(wall seconds, the server's CPU seconds) of the work after a warm-up round."""
    import grpc

    from client import rerank_request
    from service.proto import inference_pb2_grpc as pb_grpc

    queue: asyncio.Queue = asyncio.Queue()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ClassificationServiceStub(channel)

        async def client() -> None:
            while not queue.empty():
                query, docs = queue.get_nowait()
                await stub.Rerank(rerank_request(query, docs), timeout=600)

        for item in work[:clients]:  # warm-up
            queue.put_nowait(item)
        await asyncio.gather(*(client() for _ in range(clients)))
        for item in work:
            queue.put_nowait(item)
        start, cpu = time.perf_counter(), cpu_seconds(pid)
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - start, cpu_seconds(pid) - cpu


def service_side(models: Path, work: list, clients: int, flags: list[str]) -> dict:
    service = ServiceProcess(models, flags)
    try:
        seconds, cpu = asyncio.run(_service_run(service.address, service.proc.pid, work, clients))
    finally:
        service.stop()
    pairs = sum(len(d) for _, d in work)
    return {"pairs_per_s": pairs / seconds, "cpu_s_per_1k_pairs": 1000 * cpu / pairs, "cpu_s_per_call": cpu / len(work)}


def cross_encoder_side(folder: Path, work: list, batch_sizes: list[int], threads: int) -> dict:
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(threads)
    model = CrossEncoder(str(folder), local_files_only=True)
    pairs = [(q, d) for q, docs in work for d in docs]
    rates, cpu = {}, {}
    for batch in batch_sizes:
        model.predict(pairs[: 2 * batch], batch_size=batch, show_progress_bar=False)  # warm-up
        start, started_cpu = time.perf_counter(), time.process_time()
        model.predict(pairs, batch_size=batch, show_progress_bar=False)
        rates[batch] = len(pairs) / (time.perf_counter() - start)
        cpu[batch] = 1000 * (time.process_time() - started_cpu) / len(pairs)
    best = max(rates, key=rates.__getitem__)
    return {
        "pairs_per_s": rates[best],
        "cpu_s_per_1k_pairs": cpu[best],
        "best_batch": best,
        "by_batch": {k: round(v, 1) for k, v in rates.items()},
    }


def ort_side(models: Path, work: list, batch: int, threads: int, variant: str) -> dict:
    import numpy as np
    import onnxruntime as ort

    from export.onnx.classifier import feeds
    from service.classification.tokenization import PairTokenizer
    from service.manifest import load_model_dir

    model_dir = load_model_dir(models / "cross-encoder")
    m = model_dir.manifest
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(str(model_dir.file(m.graph("encoder", variant).file)), opts)
    truncation = m.extra.get("truncation", "longest_first")
    tokenizer = PairTokenizer(model_dir.file(m.tokenizer["file"]), m.max_input_tokens, truncation)
    encoded = tokenizer.encode([(q, d) for q, docs in work for d in docs])
    rows = sorted(((e.ids, e.type_ids) for e in encoded), key=lambda r: len(r[0]))
    types = "token_type_ids" in {i.name for i in sess.get_inputs()}
    batches = [feeds(rows[i : i + batch], m.special_tokens["pad"], types) for i in range(0, len(rows), batch)]
    sess.run(["logits"], batches[0])  # warm-up
    start, started_cpu = time.perf_counter(), time.process_time()
    for f in batches:
        np.asarray(sess.run(["logits"], f)[0])
    cpu = 1000 * (time.process_time() - started_cpu) / len(rows)
    return {"pairs_per_s": len(rows) / (time.perf_counter() - start), "cpu_s_per_1k_pairs": cpu, "batch": batch}


def gate_figures(model: Path, variant: str) -> dict:
    """The export gate's figures for the variant's padded graph (its verdict on a quantised one)."""
    from service.manifest import load_model_dir

    return load_model_dir(model).manifest.graph("encoder", variant).parity


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rerank_throughput", description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=["service", "cross-encoder", "ort"], help=argparse.SUPPRESS)
    p.add_argument("--root", type=Path, help="reuse a folder built by an earlier run (hf/, models/)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--calls", type=int, default=64, help="rerank calls per round")
    p.add_argument("--documents", type=int, default=20)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="torch / onnxruntime threads of the reference sides")
    p.add_argument("--st-batch-size", default="16,32,64")
    p.add_argument("--ort-batch", type=int, default=32)
    p.add_argument("--variant", default="optimized", choices=["fp32", "optimized", "int8"], help="served and timed")
    p.add_argument("--server-flag", action="append", default=[], help="extra `python -m service` flag")
    args = p.parse_args(argv)
    work = calls(load_sentences(None, args.calls * (args.documents + 1) + 1), args.calls, args.documents)
    if args.side:  # a worker: one side, one JSON line
        flags = ["--variant", args.variant, *(f for flag in args.server_flag for f in flag.split())]
        if args.side == "service":
            emit(service_side(args.root / "models", work, args.clients, flags))
        elif args.side == "cross-encoder":
            sizes = [int(b) for b in args.st_batch_size.split(",")]
            emit(cross_encoder_side(args.root / "hf", work, sizes, args.threads))
        else:
            emit(ort_side(args.root / "models", work, args.ort_batch, args.threads, args.variant))
        return 0
    root = args.root or Path(tempfile.mkdtemp(prefix="rerank-bench-"))
    if not (root / "models").is_dir():
        build(root, load_sentences(None, 5000), args.layers, args.hidden, args.variant)
    given = list(argv if argv is not None else sys.argv[1:])
    passed = [a for i, a in enumerate(given) if not (a.startswith("--root") or (i and given[i - 1] == "--root"))]
    sides = ["service", "cross-encoder", "ort"]
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            out = run_worker("bench.rerank_throughput", *passed, "--root", str(root), "--side", side, timeout=3600)
            results.setdefault(side, []).append(out)
    rate = {s: summary([o["pairs_per_s"] for o in results[s]], 1) for s in sides}
    cpu = {s: summary([o["cpu_s_per_1k_pairs"] for o in results[s]], 2) for s in sides}  # fairer on a loaded machine
    report = {
        "conditions": conditions(),
        "shape": {"layers": args.layers, "hidden": args.hidden, "documents": args.documents, "calls": args.calls},
        "variant": args.variant,
        "gate": gate_figures(root / "models" / "cross-encoder", args.variant),
        "pairs_per_s": rate,
        "service_over_cross_encoder": round(rate["service"]["median"] / rate["cross-encoder"]["median"], 3),
        "service_over_ort_alone": round(rate["service"]["median"] / rate["ort"]["median"], 3),
        "cpu_s_per_1k_pairs": cpu,
        "service_cpu_s_per_call": summary([o["cpu_s_per_call"] for o in results["service"]], 3),
        "by_cpu_service_over_cross_encoder": round(cpu["cross-encoder"]["median"] / cpu["service"]["median"], 3),
        "by_cpu_service_over_ort_alone": round(cpu["ort"]["median"] / cpu["service"]["median"], 3),
        "runs": results,
        "root": str(root),
    }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
