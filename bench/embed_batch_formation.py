"""Where an embedding server's batches lose to onnxruntime alone: batch formation and layout.

onnxruntime alone, the usual ceiling (bench/converted.py), sorts every sentence by length and runs
batches of 16 neighbours: almost no padding. A server that gets one sentence per call cannot sort
what has not arrived; its batches are the calls in flight, in arrival order. This runs the served
engines in-process, one thread, over the same `--sentences` (bench/converted_folders.py, mixed
lengths), each layout (padded, packed) and batch formation side by side, rounds alternated:
- `sorted-16`: length-sorted batches of 16 (the ceiling's batches);
- `arrival-B`: batches of B in arrival order (what B calls in flight make; B from `--arrival`).
Reported per case: sentences/s, CPU ms per sentence, computed tokens over real tokens (padding,
alignment tails of an int8 packed graph included). Prints JSON with the CPU model and the load.

    python -m bench.embed_batch_formation --model-dir DIR [--variant int8] [--arrival 8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.common import conditions
from bench.converted_folders import sentences


def _engines(model_dir: Path, variant: str, threads: int) -> dict:
    """layout -> the engine the service would run for it (service/embedding/model.load_engine)."""
    from service.embedding.model import load_engine
    from service.manifest import load_model_dir
    from service.runtime import Runtime
    from service.settings import Settings

    out = {}
    for layout in ("padded", "packed"):
        settings = Settings.from_env(
            env={},
            models=str(model_dir.parent),
            port=0,
            metrics_port=-1,
            intra_op_threads=threads,
            variant=variant,
            encoder_layout=layout,
        )
        out[layout] = load_engine(load_model_dir(model_dir), settings, Runtime(settings))[1]
    return out


def _batches(encoded: list, formation: str) -> list[list]:
    if formation == "sorted-16":
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        return [[encoded[i] for i in order[s : s + 16]] for s in range(0, len(order), 16)]
    size = int(formation.split("-")[1])
    return [encoded[s : s + size] for s in range(0, len(encoded), size)]


def _computed_tokens(model: str) -> float:
    """Tokens the engines have computed so far, padding and alignment tails included: what they
    count in `ts_batch_tokens` (in-process, no multiprocess directory)."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("ts_batch_tokens_sum", {"model": model}) or 0.0


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer

    from service.engine.tokenization import Encoded

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, required=True, help="an embedding model directory with a packed graph")
    p.add_argument("--variant", default="int8")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--arrival", default="8,16", help="batch sizes of arrival-order batches")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    before = conditions()
    engines = _engines(args.model_dir, args.variant, args.threads)
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    texts = sentences(args.sentences)
    encoded = [Encoded(e.ids, e.type_ids) for e in tokenizer.encode_batch(texts)]
    real = sum(len(e) for e in encoded)
    formations = ["sorted-16", *(f"arrival-{b}" for b in args.arrival.split(","))]
    cases = [(layout, f) for layout in engines for f in formations]
    model = json.loads((args.model_dir / "model.json").read_text())["name"]  # the engines' metrics label
    times: dict = {c: [] for c in cases}
    computed: dict = {}
    for engine in engines.values():
        engine.forward(encoded[:16])  # warm-up
    for r in range(args.rounds):
        for case in cases if r % 2 == 0 else cases[::-1]:
            engine, batches = engines[case[0]], _batches(encoded, case[1])
            tokens, wall, cpu = _computed_tokens(model), time.perf_counter(), time.process_time()
            for batch in batches:
                engine.forward(batch)
            times[case].append((time.perf_counter() - wall, time.process_time() - cpu))
            computed[case] = _computed_tokens(model) - tokens
    result = {}
    for layout, formation in cases:
        walls = [w for w, _ in times[layout, formation]]
        cpus = [c for _, c in times[layout, formation]]
        result[f"{layout}/{formation}"] = {
            "sentences_per_s": round(len(texts) / statistics.median(walls), 1),
            "cpu_ms_per_sentence": round(statistics.median(cpus) / len(texts) * 1e3, 2),
            "computed_over_real_tokens": round(computed[layout, formation] / real, 2),
        }
    out = {"model_dir": str(args.model_dir), "variant": args.variant, "threads": args.threads, "cases": result}
    out["conditions"] = {"before": before, "after": conditions()}
    sys.stdout.write(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
