"""The sides of bench.translate_throughput, each run in its own process (see bench/common.py).

    python -m bench.translate_workers torch  --checkpoint DIR --sentences FILE --batch 32 --max-length 48 ...
    python -m bench.translate_workers engine --model-dir DIR  --sentences FILE --batch 32 --max-length 48 ...

- torch: batched greedy with the PyTorch KV cache (export.models.seq2seq.Translator, `--device`,
  `--dtype`), batches in file order run until every row has ended; `--reference` adds the model's
  cache-less `greedy_decode`.
- engine: the service's TranslationModel (its queue batching concurrent calls). Imports no torch.
Sentences/s = sentences / wall time of one full pass after a warm-up pass. Each prints one JSON
line with the runs and the generated token ids of the last pass.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from bench.common import emit


def torch_side(args: argparse.Namespace, sentences: list[str]) -> dict:
    import torch
    from tokenizers import Tokenizer

    from export.models.seq2seq import Translator
    from export.train import data
    from export.train.checkpoint import load_checkpoint

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    model, meta = load_checkpoint(args.checkpoint)
    if not isinstance(model, Translator):
        raise SystemExit(f"{args.checkpoint}: a {meta['architecture']} checkpoint, not a translator")
    dev = torch.device(args.device)
    model = model.to(dev, torch.float16 if args.dtype == "fp16" else torch.float32)
    cfg = model.config
    ids = [Tokenizer.from_file(str(args.checkpoint / "tokenizer.json")).encode(s).ids for s in sentences]

    @torch.no_grad()
    def greedy(batch: list[list[int]]) -> list[list[int]]:
        src, mask = (t.to(dev) for t in data.pad(batch, cfg.pad_token_id))  # (B, S) each
        cross = model.encode(src, mask)
        rows = src.shape[0]
        last = torch.full((rows, 1), cfg.bos_token_id, dtype=torch.long, device=dev)  # (B, 1)
        done = torch.zeros(rows, dtype=torch.bool, device=dev)
        out, past = [], None
        for t in range(args.max_length):
            logits, past = model.decode(
                last,
                torch.ones(rows, t + 1, dtype=torch.long, device=dev),
                torch.full((rows, 1), t, device=dev),
                past,
                cross,
                mask,
            )
            nxt = logits[:, -1].argmax(dim=-1)  # (B,)
            out.append(nxt)
            done |= nxt == cfg.eos_token_id
            if bool(done.all()):
                break
            last = nxt[:, None]  # (B, 1)
        return [_until_eos(row, cfg.eos_token_id) for row in torch.stack(out, dim=1).tolist()]

    @torch.no_grad()
    def reference(batch: list[list[int]]) -> list[list[int]]:
        src, mask = (t.to(dev) for t in data.pad(batch, cfg.pad_token_id))  # (B, S) each
        return model.greedy_decode(src, mask, args.max_length)

    timed_pass(greedy, ids, args.batch)  # warm-up
    passes = [timed_pass(greedy, ids, args.batch) for _ in range(args.repeats)]
    result = {"sentences_per_s": [p[0] for p in passes], "tokens": passes[-1][1], "threads": torch.get_num_threads()}
    if args.reference:  # one pass: it is slow, and a warm-up has run the same code paths
        result["reference_sentences_per_s"] = [timed_pass(reference, ids, args.batch)[0]]
    return result


def timed_pass(decode, ids: list[list[int]], batch: int) -> tuple[float, list[list[int]]]:
    """Sentences/s of one pass over ids in batches, and the tokens decoded."""
    start = time.perf_counter()
    tokens = [row for b in range(0, len(ids), batch) for row in decode(ids[b : b + batch])]
    return round(len(ids) / (time.perf_counter() - start), 2), tokens


def _until_eos(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


async def engine_side(args: argparse.Namespace, sentences: list[str]) -> dict:
    from service.manifest import load_model_dir
    from service.runtime import Runtime
    from service.settings import Settings
    from service.translation.model import TranslateOptions, TranslationModel

    settings = Settings.from_env(
        env={},
        models=str(args.model_dir.parent),
        port=0,
        metrics_port=-1,
        intra_op_threads=args.threads,
        translate_max_batch=args.batch,
        variant=args.variant,
    )
    runtime = Runtime(settings)
    engine = TranslationModel.load(load_model_dir(args.model_dir), settings, runtime)
    await engine.start()
    opts = TranslateOptions(max_length=args.max_length)
    runs, tokens = [], []
    try:
        for i in range(args.repeats + 1):  # the first pass warms up
            start = time.perf_counter()
            calls = [
                engine.translate(sentences[j : j + args.per_call], opts)
                for j in range(0, len(sentences), args.per_call)
            ]
            results = await asyncio.gather(*calls)
            if i > 0:
                runs.append(round(len(sentences) / (time.perf_counter() - start), 2))
            tokens = [t.token_ids for r in results for t in r.translations]
    finally:
        await engine.stop()
        runtime.close()
    return {"sentences_per_s": runs, "tokens": tokens, "variant": engine.variant, "provider": engine.provider}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.translate_workers", description=__doc__.split("\n")[0])
    p.add_argument("side", choices=["torch", "engine"])
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--sentences", type=Path, required=True, help="JSON list of source sentences")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--per-call", type=int, default=8)
    p.add_argument("--max-length", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variant", default="auto", help="engine graph variant (settings.variant)")
    p.add_argument("--device", default="cpu", help="torch side: cpu | cuda")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"], help="torch side: weights' precision")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--reference", action="store_true", help="also time greedy_decode without a cache (slow)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    sentences = json.loads(args.sentences.read_text(encoding="utf-8"))
    emit(torch_side(args, sentences) if args.side == "torch" else asyncio.run(engine_side(args, sentences)))


if __name__ == "__main__":
    main()
