"""What projecting only the last position onto the vocabulary saves a prefill (`logits_positions`).

The served decoder graph of `--model` against the same graph as exported before it took
`logits_positions` (the gather cut out, logits at every position: `without_logits_positions`), in
one process, one intra-op thread, through the service's own KV cache (`SlotCache.prefill`, CPU
buffers), sides alternated over `--rounds`: CPU ms per prefill (this process's user + system) and
wall ms, for a few batch shapes of random token ids within the model's context. Prints JSON with
the CPU model and the logits each side hands back.

    python -m bench.prefill_logits --model models/tinystories-gpt [--variant auto] [--rounds 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from bench.common import conditions
from service.engine.graphio import GraphIO
from service.generation.cache import SlotCache
from service.manifest import load_model_dir


def without_logits_positions(src: Path, dst: Path) -> Path:
    """The decoder graph as exported before `logits_positions`: the GatherElements before the
    vocabulary projection cut out (its consumers read the normalised states of every position),
    the index's Unsqueeze and Expand dropped and the input removed."""
    model = onnx.load(str(src))
    graph = model.graph
    gather = next(n for n in graph.node if n.op_type == "GatherElements")
    upstream = {"logits_positions"}
    for node in graph.node:
        if node is not gather and any(i in upstream for i in node.input):
            upstream.update(node.output)
    drop = [n for n in graph.node if n is gather or set(n.output) & (upstream - {"logits_positions"})]
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == gather.output[0]:
                node.input[i] = gather.input[0]
    for node in drop:
        graph.node.remove(node)
    graph.input.remove(next(i for i in graph.input if i.name == "logits_positions"))
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return dst


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.prefill_logits", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="a generation model directory")
    ap.add_argument("--variant", default="optimized")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    model_dir = load_model_dir(args.model)
    manifest = model_dir.manifest
    graph = model_dir.file(manifest.graph("decoder", args.variant).file)
    context = int(manifest.architecture["max_positions"])
    with tempfile.TemporaryDirectory() as tmp:
        sides = {
            "last position": _session(graph),
            "every position": _session(without_logits_positions(graph, Path(tmp) / "old.onnx")),
        }
        ios = {name: GraphIO.inspect(s, manifest.architecture) for name, s in sides.items()}
        rng = np.random.default_rng(0)
        vocab = ios["last position"].vocab_size
        shapes = [(1, min(512, context - 1)), (8, min(64, context - 1)), (16, min(32, context - 1))]
        out: dict = {"model": manifest.name, "variant": args.variant, "vocab": vocab, "shapes": {}}
        for rows, length in shapes:
            prompts = rng.integers(1, vocab, size=(rows, length)).tolist()
            caches = {n: SlotCache(s, ios[n], capacity=rows, max_length=length + 1) for n, s in sides.items()}
            cpu: dict[str, list[float]] = {n: [] for n in sides}
            wall: dict[str, list[float]] = {n: [] for n in sides}
            for r in range(args.rounds + 1):
                for name, cache in caches.items():
                    c0, t0 = time.process_time(), time.perf_counter()
                    cache.prefill(prompts)
                    c1, t1 = time.process_time(), time.perf_counter()
                    cache.reset()
                    if r:  # the first round warms both up
                        cpu[name].append((c1 - c0) * 1e3)
                        wall[name].append((t1 - t0) * 1e3)
            med = {n: statistics.median(cpu[n]) for n in sides}
            out["shapes"][f"{rows}x{length}"] = {
                "cpu_ms": {n: round(v, 2) for n, v in med.items()},
                "wall_ms": {n: round(statistics.median(wall[n]), 2) for n in sides},
                "every_over_last_cpu": round(med["every position"] / med["last position"], 3),
                "logits_mb": {
                    "last position": rows * vocab * 4 / 1e6,
                    "every position": rows * length * vocab * 4 / 1e6,
                },
            }
    sys.stdout.write(json.dumps({**out, "conditions": conditions()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
