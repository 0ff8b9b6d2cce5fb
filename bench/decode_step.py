"""Micro-benchmark of one generation decode step in-process: Python time per step around the graph.

Drives a real `GenerationModel`'s scheduler step by step (no event loop, no gRPC): `--rows`
sequences are prefilled, then `Scheduler._decode` runs `--steps` times. The graph call
(`SlotCache.step`) is timed apart, so what is left is the scheduler's own per-step work:
sampling, detokenising, stop checks, bookkeeping, metrics. Prints JSON: medians per step (wall
and this thread's CPU time) and the Python CPU per generated token (thread CPU minus the graph's):
CPU time holds up on a busy machine where wall-clock does not.

    python -m bench.decode_step --model-dir DIR [--rows 64] [--steps 30] [--repeat 5] [--sampling]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from unittest.mock import patch

from service.generation.decoding import SamplingParams
from service.generation.model import GenerationModel
from service.manifest import load_model_dir
from service.runtime import Runtime
from service.settings import Settings

PROMPTS = ["Once upon a time", "The cat sat", "Tom and Sue went to the park", "Hi"]


def _params(i: int, sampling: bool, steps: int) -> SamplingParams:
    if not sampling:
        return SamplingParams(max_new_tokens=steps + 2)
    return SamplingParams(
        max_new_tokens=steps + 2,
        temperature=0.8,
        top_k=40 if i % 2 else 0,
        top_p=0.9,
        repetition_penalty=1.1 if i % 3 == 0 else 0.0,
        seed=i,
    )


def one_run(model: GenerationModel, rows: int, steps: int, sampling: bool) -> dict[str, float]:
    sched, cache = model.scheduler, model.scheduler.cache
    for i in range(rows):
        model.submit(PROMPTS[i % len(PROMPTS)], _params(i, sampling, steps))
    while sched.waiting:
        sched._deliver(sched._prefill(sched._admit()))
    graph = graph_cpu = 0.0
    step = cache.step

    def timed_step(tokens):
        nonlocal graph, graph_cpu
        t, c = time.perf_counter(), time.thread_time()
        try:
            return step(tokens)
        finally:
            graph += time.perf_counter() - t
            graph_cpu += time.thread_time() - c

    with patch.object(cache, "step", timed_step):  # the graph's share of each step, timed in place
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            sched._deliver(sched._decode())
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    for seq in sched.running:
        seq.cancelled = True
    sched._deliver(sched._decode())
    per_step = 1e6 / steps
    return {
        "step_us": wall * per_step,
        "graph_us": graph * per_step,
        "python_us": (wall - graph) * per_step,
        "thread_cpu_us": cpu * per_step,
        "python_cpu_us": (cpu - graph_cpu) * per_step,
        "python_cpu_us_per_token": (cpu - graph_cpu) * per_step / rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sampling", action="store_true", help="mixed sampling settings instead of greedy")
    args = ap.parse_args()
    settings = Settings.from_env(
        env={}, models=str(args.model_dir.parent), variant="fp32", gen_max_batch=args.rows, gen_max_queue=args.rows
    )
    runtime = Runtime(settings)
    model = GenerationModel.load(load_model_dir(args.model_dir), settings, runtime)
    one_run(model, args.rows, args.steps, args.sampling)  # warm-up
    runs = [one_run(model, args.rows, args.steps, args.sampling) for _ in range(args.repeat)]
    out = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
    out.update(rows=args.rows, steps=args.steps, repeat=args.repeat, sampling=args.sampling)
    print(json.dumps(out))
    runtime.close()


if __name__ == "__main__":
    main()
