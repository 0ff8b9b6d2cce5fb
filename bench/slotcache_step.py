"""The generation KV cache's decode step (`SlotCache.step`) of a git revision vs the working tree.

Both run in one process on one session, in alternating rounds, greedy from the same prompts, so
the only difference is service/generation/cache.py itself (the baseline is loaded from
`git show REF:...`). Reports per-step wall time and process CPU time (median over rounds) and
decode tokens/s, for each row count. Not a test; prints one JSON object.

    python -m bench.slotcache_step --baseline main --rows 1 8
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, conditions
from service.engine.graphio import GraphIO
from service.generation import cache as batchcache
from service.manifest import load_model_dir
from service.runtime import Runtime
from service.settings import Settings

PROMPT = [0, 431, 12, 99, 7, 250, 31, 18]


def _baseline(ref: str):
    """service/generation/cache.py as of git revision ref, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{ref}:service/generation/cache.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_batchcache.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_batchcache", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time_steps(module, session, io, context: int, device: str, rows: int, steps: int) -> tuple[float, float]:
    """(wall, cpu) microseconds per decode step of `rows` rows, after one warm-up step."""
    cache = module.SlotCache(session, io, capacity=max(16, rows), max_length=context, device=device)
    tokens = cache.prefill([PROMPT[: 3 + i % 5] for i in range(rows)]).argmax(-1).tolist()
    tokens = cache.step(tokens).argmax(-1).tolist()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        tokens = cache.step(tokens).argmax(-1).tolist()
    return (time.perf_counter() - wall) / steps * 1e6, (time.process_time() - cpu) / steps * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/tinystories-gpt", help="a generation model directory")
    p.add_argument("--baseline", default="main", help="git revision whose service/generation/cache.py is compared")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    model_dir = load_model_dir(args.model)
    m = model_dir.manifest
    runtime = Runtime(Settings.from_env(env={}, device=args.device))
    variant = runtime.choose_variant(m, "decoder")
    session = runtime.create_session(model_dir.file(m.graph("decoder", variant).file))
    io = GraphIO.inspect(session, m.architecture)
    device = "cuda" if runtime.is_cuda else "cpu"
    sides = {"baseline": _baseline(args.baseline), "working_tree": batchcache}
    out = {"conditions": conditions(), "variant": variant, "provider": runtime.provider, "baseline": args.baseline}
    for rows in args.rows:
        runs: dict[str, list] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, module in sides.items():
                runs[name].append(
                    _time_steps(module, session, io, int(m.architecture["max_positions"]), device, rows, args.steps)
                )
        for name, r in runs.items():
            wall = statistics.median(x[0] for x in r)
            out[f"{name}_{rows}_rows"] = {
                "step_us_wall": round(wall, 1),
                "step_us_cpu": round(statistics.median(x[1] for x in r), 1),
                "tokens_per_s": round(rows * 1e6 / wall, 1),
            }
    runtime.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
