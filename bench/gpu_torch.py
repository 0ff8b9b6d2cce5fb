"""The PyTorch sides of bench.gpu, each run in its own process (bench/common.py); one JSON line out.

    python -m bench.gpu_torch generate --checkpoint DIR --device cuda --dtype fp16 --prompts FILE ...
    python -m bench.gpu_torch embed --device cuda --sentences FILE --batches 64,128,256 --vectors OUT.npy

- generate: the decoder (export.models.decoder.GPTDecoder) with its own KV cache on `--device` in
  `--dtype`. Correctness: each prompt alone, greedy, stopped at EOS (the service stops there too).
  Throughput: one stream (decode tokens/s: tokens after the first over the time since the first),
  and a static batch of `--rows` left-padded prompts stepped together for `--new-tokens` steps
  (rows x steps / time, every row counted to the end: the figure most favourable to PyTorch).
- embed: sentence-transformers (all-MiniLM-L6-v2) in fp16 at each batch size of `--batches`
  (the best is the baseline), and once in fp32, whose vectors are saved for the cosine check.
Each phase stops after `--budget-s` seconds of measuring and says how many passes it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.common import emit


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def generate_side(args: argparse.Namespace) -> dict:
    import torch
    from tokenizers import Tokenizer

    from export.models.decoder import GPTDecoder
    from export.train.checkpoint import load_checkpoint

    dev = torch.device(args.device)
    model, meta = load_checkpoint(args.checkpoint)
    if not isinstance(model, GPTDecoder):
        raise SystemExit(f"{args.checkpoint}: a {meta['architecture']} checkpoint, not a generator")
    model = model.to(dev, torch.float16 if args.dtype == "fp16" else torch.float32)
    cfg = model.config
    tok = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json"))
    prompts = [tok.encode(p).ids for p in json.loads(args.prompts.read_text(encoding="utf-8"))]

    @torch.no_grad()
    def greedy(rows: list[list[int]], steps: int, stop_at_eos: bool) -> tuple[list[list[int]], float]:
        """Left-padded batch -> tokens per row, and seconds from the first token to the last."""
        width = max(len(r) for r in rows)
        ids = torch.tensor([[cfg.pad_token_id] * (width - len(r)) + r for r in rows], device=dev)  # (B, T)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=dev)  # (B, T)
        pos = (mask.cumsum(1) - 1).clamp(min=0)  # (B, T)
        logits, past = model(ids, mask, pos)
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out = [nxt]
        _sync(torch, dev)  # the prefill is not timed
        start = time.perf_counter()
        for _ in range(steps - 1):
            if stop_at_eos and int(nxt[0, 0]) == cfg.eos_token_id:  # one row: stop as the service does
                break
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)  # (B, P+1)
            pos = pos[:, -1:] + 1  # (B, 1)
            logits, past = model(nxt, mask, pos, past)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
        tokens = torch.cat(out, dim=1).tolist()  # one transfer; syncs the device
        return [_until(r, cfg.eos_token_id) for r in tokens], time.perf_counter() - start

    alone = [greedy([p], args.new_tokens, True)[0][0] for p in prompts]
    one, _ = _timed(lambda: greedy([prompts[0]], args.new_tokens, False), args.budget_s)
    rows = [prompts[i % len(prompts)] for i in range(args.rows)]
    many, _ = _timed(lambda: greedy(rows, args.new_tokens, False), args.budget_s)
    return {
        "device": str(dev),
        "dtype": args.dtype,
        "tokens": alone,
        "one_stream_tokens_per_s": round(statistics.median((args.new_tokens - 1) / s for s in one), 1),
        "batch_rows": args.rows,
        "batch_tokens_per_s": round(statistics.median(args.rows * (args.new_tokens - 1) / s for s in many), 1),
        "passes": [len(one), len(many)],
    }


def _timed(run, budget_s: float) -> tuple[list[float], object]:
    """Runs run() -> (result, seconds) once to warm up, then until budget_s has passed (at least once)."""
    run()
    seconds: list[float] = []
    result, end = None, time.perf_counter() + budget_s
    while not seconds or time.perf_counter() < end:
        result, s = run()
        seconds.append(s)
    return seconds, result


def _until(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


def embed_side(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from bench.embed_throughput import sentence_transformers_run

    sentences = json.loads(args.sentences.read_text(encoding="utf-8"))
    sweep: dict[str, float] = {}  # every batch size: one pass each (after its warm-up), seconds apiece on a GPU
    for batch in (int(b) for b in args.batches.split(",")):
        seconds, _ = sentence_transformers_run(sentences, batch, 0, args.device, fp16=args.device != "cpu")
        sweep[str(batch)] = round(len(sentences) / seconds, 1)
    _, vectors = sentence_transformers_run(sentences, int(args.batches.split(",")[0]), 0, args.device)
    np.save(args.vectors, vectors)
    best = max(sweep, key=sweep.__getitem__)
    return {
        "device": args.device,
        "fp16": args.device != "cpu",
        "sentences": len(sentences),
        "sentences_per_s_by_batch": sweep,
        "best_batch": int(best),
        "best_sentences_per_s": sweep[best],
        "torch": torch.__version__,
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_torch", description=__doc__.split("\n")[0])
    p.add_argument("side", choices=["generate", "embed"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget-s", type=float, default=10.0, help="measuring time per phase (after a warm-up)")
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--dtype", default="fp16", choices=["fp16", "fp32"])
    p.add_argument("--prompts", type=Path, help="JSON list of prompts")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rows", type=int, default=64, help="rows of the static batch")
    p.add_argument("--sentences", type=Path, help="JSON list of sentences")
    p.add_argument("--batches", default="64,128,256,512", help="sentence-transformers batch sizes (fp16)")
    p.add_argument("--vectors", type=Path, help="where the fp32 vectors go (.npy)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    emit(generate_side(args) if args.side == "generate" else embed_side(args))


if __name__ == "__main__":
    main()
