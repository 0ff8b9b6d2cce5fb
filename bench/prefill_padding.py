"""What padding costs the generator's prefill, and what sub-batches or packing could give back.

onnxruntime alone (1 thread), the served decoder graph through the service's own KV cache
(service/generation/cache.py `SlotCache`, CPU buffers), 16 prompts of mixed length (windows of
4-100 words of the checkpoint's held-out stories, truncated to the model's input limit), in
arrival order, many rounds of 16:
- padded: the 16 prompts in one right-padded prefill (today's path when they arrive together);
- turns: as the scheduler admits them, at most `PREFILL_TOKENS_PER_STEP` padded tokens per prefill;
- sub-batches: the 16 sorted by length, cut where padding would pass 25 %, one prefill each;
- packed (a proxy: no packed decoder graph exists): the same graph on rows full of real tokens,
  as many rows of `--row-tokens` as the prompts' tokens fill, plus the numpy copy a packed prefill
  would need to move each prompt's K/V into its own cache row;
and, for scale, 64 greedy decode steps of the 16 rows (what follows a prefill in a request).

    python -m bench.prefill_padding --model models/tinystories-gpt [--variant optimized] [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.common import ROOT, conditions, summary


def prompts(model_dir, count: int, seed: int = 0) -> list[list[int]]:
    from tokenizers import Tokenizer

    m = model_dir.manifest
    lines = (ROOT / "checkpoints" / m.name / "heldout.jsonl").read_text(encoding="utf-8").splitlines()
    words = [w for line in lines for w in json.loads(line)["text"].split()]
    tok = Tokenizer.from_file(str(model_dir.file(m.tokenizer["file"])))
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(4, 100)
        start = rng.randrange(0, len(words) - n)
        out.append(tok.encode(" ".join(words[start : start + n])).ids[: m.max_input_tokens])
    return out


def sub_batches(batch: list[list[int]], max_padding: float = 0.25) -> list[list[list[int]]]:
    """Sorted by length; a new sub-batch wherever the next prompt would take padding past max_padding."""
    groups: list[list[list[int]]] = []
    for p in sorted(batch, key=len):
        g = groups[-1] if groups else None
        if g is not None and len(p) * (len(g) + 1) <= (1 + max_padding) * (sum(map(len, g)) + len(p)):
            g.append(p)
        else:
            groups.append([p])
    return groups


def turns(batch: list[list[int]], budget: int) -> list[list[list[int]]]:
    """Arrival order, at most `budget` padded tokens per prefill (the scheduler's admission)."""
    out: list[list[list[int]]] = [[]]
    for p in batch:
        g = out[-1]
        if g and max(map(len, [*g, p])) * (len(g) + 1) > budget:
            out.append([p])
        else:
            g.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort

    from service.engine.graphio import GraphIO
    from service.generation.cache import SlotCache
    from service.generation.model import PREFILL_TOKENS_PER_STEP
    from service.manifest import load_model_dir

    p = argparse.ArgumentParser(prog="python -m bench.prefill_padding", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=Path("models/tinystories-gpt"))
    p.add_argument("--variant", default="optimized")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--row-tokens", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=64)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)

    before = conditions()
    model_dir = load_model_dir(args.model)
    m = model_dir.manifest
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    sess = ort.InferenceSession(
        str(model_dir.file(m.graph("decoder", args.variant).file)), opts, providers=["CPUExecutionProvider"]
    )
    io = GraphIO.inspect(sess, m.architecture)
    context = int(m.architecture["max_positions"])
    cache = SlotCache(sess, io, 64, context, "cpu")
    batches = [prompts(model_dir, 16, seed) for seed in range(args.rounds)]
    real = sum(len(q) for b in batches for q in b)

    def timed(plan) -> tuple[float, int]:
        """Seconds and computed tokens of every round's prefills as plan(batch) groups them."""
        computed, start = 0, time.perf_counter()
        for b in batches:
            for group in plan(b):
                cache.prefill(group)
                computed += max(map(len, group)) * len(group)
            cache.reset()
        return time.perf_counter() - start, computed

    def packed_rows(b: list[list[int]]) -> list[list[list[int]]]:
        rows = -(-sum(map(len, b)) // args.row_tokens)
        return [[[1] * args.row_tokens for _ in range(rows)]]

    plans: dict[str, Callable[[list[list[int]]], list[list[list[int]]]]] = {
        "padded": lambda b: [b],
        "turns": lambda b: turns(b, PREFILL_TOKENS_PER_STEP),
        "sub_batches": sub_batches,
        "packed_proxy": packed_rows,
    }
    timed(plans["padded"])  # warm-up
    results: dict[str, list[float]] = {k: [] for k in plans}
    computed: dict[str, int] = {}
    for _ in range(3):  # sides alternated
        for name, plan in plans.items():
            seconds, computed[name] = timed(plan)
            results[name].append(real / seconds)

    # what a packed prefill adds: each prompt's K/V out of the packed rows into its cache row
    kv_shape = (1, io.n_heads, args.row_tokens, io.head_dim)
    present: list[np.ndarray] = [
        np.random.default_rng(0).normal(size=kv_shape).astype(io.kv_dtype) for _ in io.past_names
    ]
    buffers: list[np.ndarray] = [np.zeros((16, io.n_heads, context, io.head_dim), io.kv_dtype) for _ in io.past_names]
    start, copies = time.perf_counter(), 0
    for b in batches:
        offset = 0
        for i, q in enumerate(b):
            n = min(len(q), args.row_tokens - offset % args.row_tokens)
            for src, dst in zip(present, buffers, strict=True):
                dst[i, :, :n] = src[0, :, :n]
            copies += 1
            offset += len(q)
    scatter_s = time.perf_counter() - start

    # decode, for scale: 16 rows of mean-length prompts, then greedy steps
    decode = []
    for _ in range(3):
        cache.reset()
        cache.prefill(batches[0])
        start = time.perf_counter()
        for _ in range(args.decode_steps):
            cache.step([1] * 16)
        decode.append(args.decode_steps * 16 / (time.perf_counter() - start))
    padded_s_per_round = statistics.median([real / r for r in results["padded"]]) / args.rounds

    out = {
        "model": m.name,
        "variant": args.variant,
        "prompts": 16 * args.rounds,
        "prompt_tokens": {"mean": round(real / (16 * args.rounds), 1), "max": max(len(q) for b in batches for q in b)},
        "real_tokens_per_s": {k: summary(v, 0) for k, v in results.items()},
        "over_padded": {
            k: round(statistics.median(v) / statistics.median(results["padded"]), 2) for k, v in results.items()
        },
        "computed_per_real": {k: round(v / real, 3) for k, v in computed.items()},
        "packed_kv_copy_ms_per_16": round(1e3 * scatter_s / args.rounds, 3),
        "padded_prefill_ms_per_16": round(1e3 * padded_s_per_round, 1),
        "decode_tokens_per_s_16_rows": summary(decode, 0),
        "decode_ms_for_steps": round(1e3 * args.decode_steps * 16 / statistics.median(decode), 1),
        "conditions": {
            "before": before,
            "after": conditions(),
            "threads": 1,
            "row_tokens": args.row_tokens,
            "decode_steps": args.decode_steps,
        },
    }
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
