"""Short translation calls arriving behind long beam searches; JSON to stdout.

Drives the service's TranslationModel in-process (no gRPC): `--long` calls, each one source made
of two of the longest test sentences, with beam `--beam` (up to the model's max_output_tokens)
start first; while they run,
a one-sentence greedy call arrives every `--gap-ms` (sentences of tests/data/tatoeba-en-fr-160.txt
in turn). Reports the short calls' latency (p50, p95, max), the long calls' wall time, and the
sentences/s of the whole workload. The engine's own figures, not a comparison: run it once per
build (before and after a change) on the same machine; it imports only the stable API
(TranslationModel.load, TranslateOptions), so `PYTHONPATH=OTHER_TREE python bench/translate_mixed.py`
measures another checkout with the same workload.

    python -m bench.translate_mixed [--model models/tatoeba-en-fr] [--long 2] [--beam 8] [--short 40] [--gap-ms 25]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from service.manifest import load_model_dir
from service.runtime import Runtime
from service.settings import Settings
from service.translation.model import TranslateOptions, TranslationModel

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "tatoeba-en-fr-160.txt"


async def timed(coro) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


async def workload(model: TranslationModel, args, english: list[str]) -> dict:
    by_length = sorted(english, key=len)
    longest = [" ".join(by_length[-2 - 2 * i :][:2]) for i in range(args.long)]  # two long sentences a source
    start = time.perf_counter()
    longs = [asyncio.ensure_future(timed(model.translate([s], TranslateOptions(beam_size=args.beam)))) for s in longest]
    shorts = []
    for i in range(args.short):
        await asyncio.sleep(args.gap_ms / 1e3)
        shorts.append(asyncio.ensure_future(timed(model.translate([english[i % len(english)]], TranslateOptions()))))
    short_s, long_s = await asyncio.gather(asyncio.gather(*shorts), asyncio.gather(*longs))
    wall = time.perf_counter() - start
    short_ms = sorted(1e3 * s for s in short_s)
    return {
        "short_p50_ms": round(statistics.median(short_ms), 1),
        "short_p95_ms": round(short_ms[int(0.95 * (len(short_ms) - 1))], 1),
        "short_max_ms": round(short_ms[-1], 1),
        "long_ms": [round(1e3 * s, 1) for s in long_s],
        "sentences_per_s": round((args.long + args.short) / wall, 1),
    }


async def main_async(args) -> dict:
    lines = DATA.read_text(encoding="utf-8").splitlines()
    english = lines[0::2]  # the file alternates English and French lines
    runtime = Runtime(Settings.from_env(env={}, intra_op_threads=args.threads))
    model = TranslationModel.load(load_model_dir(args.model), runtime.settings, runtime)
    await model.start()
    await model.translate(english[:8], TranslateOptions(beam_size=args.beam))  # warm-up
    runs = [await workload(model, args, english) for _ in range(args.rounds)]
    await model.stop()
    runtime.close()
    return {
        "model": str(args.model),
        "variant": model.variant,
        "long_calls": args.long,
        "beam": args.beam,
        "short_calls": args.short,
        "gap_ms": args.gap_ms,
        "rounds": runs,
        "cpu": _cpu_name(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.translate_mixed", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=Path("models/tatoeba-en-fr"))
    p.add_argument("--long", type=int, default=2, help="long beam-search calls (one sentence each)")
    p.add_argument("--beam", type=int, default=8)
    p.add_argument("--short", type=int, default=40, help="one-sentence greedy calls arriving during them")
    p.add_argument("--gap-ms", type=float, default=25.0)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.stdout.write(json.dumps(asyncio.run(main_async(parse_args(sys.argv[1:]))), indent=2) + "\n")
