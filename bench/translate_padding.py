"""What padding costs the translator's encoder, and what packed rows give back: one run, sides alternated.

Through a real `python -m service` (16 concurrent clients x 1 sentence per call, greedy), the
translator served with its packed encoder (the default) and padded (`--embed-pack-row-tokens 0`):
- sentences/s and input tokens/s on mixed lengths and on uniform lengths of the same mean, and
  the server's CPU seconds (user + system, /proc) per 1,000 input tokens;
- the padding the encoder computed (`ts_batch_padding_ratio`: computed / real tokens, mean);
beside, in its own process with the same threads, the encoder graph alone (onnxruntime) on
arrival-order batches of 16 of the mixed sources: padded, and packed in rows of the served length.
Mixed sources: 1-4 consecutive held-out test sentences of the checkpoint joined (up to the model's
input limit); uniform: joins whose token count is the mixed mean (+-1). The translations (and so
the decoder's work) are the same on both sides: greedy tokens do not depend on the encoder's layout.

    python -m bench.translate_padding --model models/tatoeba-en-fr [--sentences 400] [--rounds 2]
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

from bench.common import ROOT, ServiceProcess, conditions, emit, run_worker, scrape_histogram, summary
from bench.procstat import cpu_seconds

WORKER = "bench.translate_padding"


def sources(model_dir: Path, count: int, uniform: bool, seed: int = 0) -> list[str]:
    """count joins of 1-4 consecutive held-out sentences (mixed), or of the mixed mean's token count."""
    from tokenizers import Tokenizer

    from service.manifest import load_model_dir

    m = load_model_dir(model_dir).manifest
    name = m.name if (ROOT / "checkpoints" / m.name / "heldout.jsonl").is_file() else "tatoeba-en-fr"
    lines = (ROOT / "checkpoints" / name / "heldout.jsonl").read_text(encoding="utf-8").splitlines()
    english = [json.loads(line)["source"] for line in lines]
    tok = Tokenizer.from_file(str(model_dir / m.tokenizer["file"]))
    rng = random.Random(seed)

    def join(n: int) -> str:
        start = rng.randrange(0, len(english) - n)
        return " ".join(english[start : start + n])

    def fitting(candidates: list[str]) -> list[tuple[str, int]]:
        lengths = [len(e.ids) for e in tok.encode_batch(candidates)]
        return [(t, n) for t, n in zip(candidates, lengths, strict=True) if n <= m.max_input_tokens]

    mixed: list[tuple[str, int]] = []
    while len(mixed) < count:
        mixed += fitting([join(rng.randint(1, 4)) for _ in range(count)])
    mixed = mixed[:count]
    if not uniform:
        return [t for t, _ in mixed]
    mean = round(statistics.mean(n for _, n in mixed))
    out: list[str] = []
    while len(out) < count:
        out += [t for t, n in fitting([join(rng.randint(1, 4)) for _ in range(500)]) if abs(n - mean) <= 1]
    return out[:count]


# ---- workers (each side in its own process) -------------------------------------------------------


async def _clients(address: str, model: str, items: list[str], clients: int) -> tuple[float, int]:
    import grpc

    from service.proto import inference_pb2 as pb
    from service.proto import inference_pb2_grpc as pb_grpc

    queue: asyncio.Queue = asyncio.Queue()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.TranslationServiceStub(channel)

        output_tokens = 0

        async def client() -> None:
            nonlocal output_tokens
            while not queue.empty():
                reply = await stub.Translate(pb.TranslateRequest(model=model, inputs=[queue.get_nowait()]), timeout=300)
                output_tokens += reply.usage.output_tokens

        for text in items[: clients * 2]:  # warm-up
            queue.put_nowait(text)
        await asyncio.gather(*(client() for _ in range(clients)))
        output_tokens = 0
        for text in items:
            queue.put_nowait(text)
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - start, output_tokens


def client_side(args) -> dict:
    items = json.loads(Path(args.texts).read_text())
    cpu = cpu_seconds(args.server_pid)
    before = scrape_histogram(args.metrics_url, "ts_batch_padding_ratio")
    wall, output_tokens = asyncio.run(_clients(args.address, args.name, items, args.clients))
    cpu = cpu_seconds(args.server_pid) - cpu
    after = scrape_histogram(args.metrics_url, "ts_batch_padding_ratio")
    count = after.get("count", 0) - before.get("count", 0)
    ratio = (after.get("sum", 0) - before.get("sum", 0)) / count if count else None
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "padding_ratio_mean": ratio,
        "encoder_runs": count,
        "output_tokens": output_tokens,
    }


def ort_side(args) -> dict:
    """The encoder graph alone: arrival-order batches of 16, padded or packed (as the service feeds it)."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from service.manifest import load_model_dir
    from service.translation import encoder as source_encoder

    model_dir = load_model_dir(args.model_dir)
    m = model_dir.manifest
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    sess = ort.InferenceSession(
        str(model_dir.file(m.graph(args.role, args.variant).file)), opts, providers=["CPUExecutionProvider"]
    )
    tok = Tokenizer.from_file(str(model_dir.file(m.tokenizer["file"])))
    seqs = [e.ids for e in tok.encode_batch(json.loads(Path(args.texts).read_text()))]
    pad = int(m.special_tokens.get("pad", 0))
    row_tokens = args.row_tokens if args.role == "packed" else None
    align = source_encoder.alignment(args.variant)
    batches = [seqs[i : i + 16] for i in range(0, len(seqs), 16)]
    computed = 0
    sess.run(None, source_encoder.feeds(batches[0], pad, row_tokens, align)[0])
    start = time.perf_counter()
    for b in batches:
        feeds, _, n = source_encoder.feeds(b, pad, row_tokens, align)
        sess.run(None, feeds)
        computed += n
    return {"wall_s": time.perf_counter() - start, "tokens": sum(map(len, seqs)), "computed": computed}


# ---- orchestration --------------------------------------------------------------------------------


def served(flags: list[str], model: str, text_files: dict, args) -> dict:
    service = ServiceProcess(args.models_root, ["--intra-op-threads", str(args.threads), *flags], metrics=True)
    try:
        return {
            shape: run_worker(
                WORKER,
                "client",
                "--address",
                service.address,
                "--metrics-url",
                service.metrics_url,
                "--server-pid",
                str(service.proc.pid),
                "--name",
                model,
                "--texts",
                str(path),
                "--clients",
                str(args.clients),
            )
            for shape, path in text_files.items()
        }
    finally:
        service.stop()


def bench(args, tmp: Path) -> dict:
    from tokenizers import Tokenizer

    from service.manifest import load_model_dir
    from service.translation.encoder import encoder_graph

    m = load_model_dir(args.model).manifest
    tok = Tokenizer.from_file(str(args.model / m.tokenizer["file"]))
    files: dict[str, Path] = {}
    tokens: dict[str, int] = {}
    counts: dict[str, Any] = {}
    for shape in ("mixed", "uniform"):
        items = sources(args.model, args.sentences, shape == "uniform")
        files[shape] = tmp / f"{shape}.json"
        files[shape].write_text(json.dumps(items))
        lengths = [len(e.ids) for e in tok.encode_batch(items)]
        tokens[shape], counts[shape] = sum(lengths), len(items)
        lengths_of = {"mean": round(statistics.mean(lengths), 1), "min": min(lengths), "max": max(lengths)}
        counts[f"{shape}_lengths"] = lengths_of
    variant = args.variant
    role, enc_variant = encoder_graph(m, variant, args.row_tokens)
    rounds = []
    flags = ["--variant", variant, "--embed-pack-row-tokens", str(args.row_tokens)]
    for _ in range(args.rounds):
        r = {
            "packed": served(flags, m.name, files, args),
            "padded": served(["--variant", variant, "--embed-pack-row-tokens", "0"], m.name, files, args),
        }
        common = [
            "--model-dir",
            str(args.model),
            "--variant",
            enc_variant,
            "--texts",
            str(files["mixed"]),
            "--threads",
            str(args.threads),
            "--row-tokens",
            str(args.row_tokens),
        ]
        r["ort_padded"] = run_worker(WORKER, "ort", "--role", "encoder", *common)
        r["ort_packed"] = run_worker(WORKER, "ort", "--role", "packed", *common)
        rounds.append(r)
    return report(rounds, tokens, counts, variant, role)


def report(rounds: list[dict], tokens: dict, counts: dict, variant: str, role: str) -> dict:
    out: dict[str, Any] = {"variant": variant, "served_encoder": role, "input_tokens": tokens, "sentences": counts}
    for mode in ("packed", "padded"):
        side: dict[str, Any] = {}
        out[mode] = side
        for shape in ("mixed", "uniform"):
            side[f"{shape}_sentences_per_s"] = summary([counts[shape] / r[mode][shape]["wall_s"] for r in rounds], 1)
            side[f"{shape}_cpu_s_per_1000_tokens"] = summary(
                [1000 * r[mode][shape]["cpu_s"] / tokens[shape] for r in rounds], 3
            )
            side[f"{shape}_padding_ratio"] = rounds[-1][mode][shape]["padding_ratio_mean"]
            side[f"{shape}_encoder_runs"] = rounds[-1][mode][shape]["encoder_runs"]
            side[f"{shape}_output_tokens"] = rounds[-1][mode][shape]["output_tokens"]
            side[f"{shape}_cpu_s_per_1000_output_tokens"] = summary(
                [1000 * r[mode][shape]["cpu_s"] / r[mode][shape]["output_tokens"] for r in rounds], 3
            )
        side["mixed_over_uniform_tokens_per_s"] = summary(
            [
                (tokens["mixed"] / r[mode]["mixed"]["wall_s"]) / (tokens["uniform"] / r[mode]["uniform"]["wall_s"])
                for r in rounds
            ]
        )
    for shape in ("mixed", "uniform"):
        out[f"packed_over_padded_{shape}_sentences_per_s"] = summary(
            [r["padded"][shape]["wall_s"] / r["packed"][shape]["wall_s"] for r in rounds]
        )
    for mode in ("padded", "packed"):
        out[f"encoder_alone_{mode}_tokens_per_s"] = summary(
            [r[f"ort_{mode}"]["tokens"] / r[f"ort_{mode}"]["wall_s"] for r in rounds], 0
        )
        out[f"encoder_alone_{mode}_computed_per_real"] = round(
            rounds[-1][f"ort_{mode}"]["computed"] / rounds[-1][f"ort_{mode}"]["tokens"], 3
        )
    out["encoder_alone_packed_over_padded"] = summary(
        [r["ort_padded"]["wall_s"] / r["ort_packed"]["wall_s"] for r in rounds]
    )
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {WORKER}", description=__doc__.split("\n")[0])
    p.add_argument("side", nargs="?", choices=["client", "ort"], help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, default=Path("models/tatoeba-en-fr"), help="a translation model directory")
    p.add_argument("--sentences", type=int, default=400)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--row-tokens", type=int, default=128, help="the served embed_pack_row_tokens")
    p.add_argument("--variant", default="optimized", help="the served variant (the CPU's auto for the shipped model)")
    for name in ("--address", "--metrics-url", "--texts", "--model-dir", "--role", "--name"):
        p.add_argument(name)
    p.add_argument("--server-pid", type=int)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.side:
        emit({"client": client_side, "ort": ort_side}[args.side](args))
        return 0
    import tempfile

    args.model = args.model.resolve()
    before = conditions()
    with tempfile.TemporaryDirectory(prefix="bench-translate-padding-") as tmp:
        args.models_root = Path(tmp) / "models"  # the translator alone
        args.models_root.mkdir()
        (args.models_root / args.model.name).symlink_to(args.model, target_is_directory=True)
        result = bench(args, Path(tmp))
    result["conditions"] = {
        "before": before,
        "after": conditions(),
        "threads": args.threads,
        "clients": args.clients,
        "rounds": args.rounds,
        "row_tokens": args.row_tokens,
    }
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
