"""The sides of bench.generate_throughput, each run in its own process (see bench/common.py).

    python -m bench.generate_workers torch  --checkpoint DIR --new-tokens N --threads T --repeats R
    python -m bench.generate_workers engine --model-dir DIR  --new-tokens N --threads T --repeats R
    python -m bench.generate_workers client --address HOST:PORT --metrics-url URL --streams 1,8 ...

- torch: greedy decoding with the PyTorch model's own KV cache (export.models.decoder.GPTDecoder, fp32,
  `torch.set_num_threads(T)`), one token per forward call, argmax on the last logits.
- engine: the service's GenerationModel (scheduler, KV cache, sampling, detokenising; no gRPC),
  onnxruntime with T intra-op threads. Imports no torch.
- client: concurrent GenerateStream calls against a running `python -m service`; aggregate
  tokens/s per concurrency, and the server's decode batch-size histogram over the runs.
Single-stream figures are decode-phase tokens/s: tokens after the first / time since the first
(the prompt's prefill is excluded on both sides). Each prints one JSON line (bench.common.emit).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from bench.common import emit, histogram_delta, scrape_histogram

PROMPTS = [
    "Once upon a time",
    "One day, a little girl named Lily",
    "Tom had a big red ball.",
    "The sun was hot and",
    "There was a cat",
    "Sam and his mom went to the park",
    "A bird sat on a tree",
    "Mia wanted a cookie",
]


def torch_side(args: argparse.Namespace) -> dict:
    import torch
    from tokenizers import Tokenizer

    from export.train.checkpoint import load_checkpoint

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    model, _ = load_checkpoint(args.checkpoint)
    prompt_ids = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json")).encode(PROMPTS[0]).ids

    @torch.no_grad()
    def decode() -> tuple[float, list[int]]:
        logits, past = model(torch.tensor([prompt_ids]))  # prefill (1, T)
        tokens = [int(logits[0, -1].argmax())]
        start = time.perf_counter()
        for _ in range(args.new_tokens - 1):
            position = torch.tensor([[len(prompt_ids) + len(tokens) - 1]])  # (1, 1)
            logits, past = model(torch.tensor([[tokens[-1]]]), position_ids=position, past=past)
            tokens.append(int(logits[0, -1].argmax()))
        return (len(tokens) - 1) / (time.perf_counter() - start), tokens

    decode()  # warm-up
    runs = [decode() for _ in range(args.repeats)]
    return {"tokens_per_s": [round(r[0], 1) for r in runs], "tokens": runs[-1][1], "threads": torch.get_num_threads()}


async def engine_side(args: argparse.Namespace) -> dict:
    from service.generation.decoding import SamplingParams
    from service.generation.model import GenerationModel
    from service.manifest import load_model_dir
    from service.runtime import Runtime
    from service.settings import Settings

    settings = Settings.from_env(
        env={},
        models=str(args.model_dir.parent),
        port=0,
        metrics_port=-1,
        intra_op_threads=args.threads,
        variant=args.variant,
    )
    runtime = Runtime(settings)
    engine = GenerationModel.load(load_model_dir(args.model_dir), settings, runtime)
    await engine.start()

    async def decode() -> tuple[float, list[int]]:
        handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=args.new_tokens))
        tokens: list[int] = []
        first_at = 0.0
        async for chunk in handle:
            first_at = first_at or time.perf_counter()
            tokens += chunk.token_ids
        return (len(tokens) - 1) / (time.perf_counter() - first_at), tokens

    try:
        await decode()  # warm-up
        runs = [await decode() for _ in range(args.repeats)]
    finally:
        await engine.stop()
        runtime.close()
    return {
        "tokens_per_s": [round(r[0], 1) for r in runs],
        "tokens": runs[-1][1],
        "variant": engine.variant,
        "provider": engine.provider,
    }


async def streams_tps(client, streams: int, new_tokens: int) -> float:
    """Aggregate tokens/s of `streams` concurrent GenerateStream calls (first request to last token)."""

    async def one(prompt: str) -> int:
        return sum([len(c.token_ids) async for c in client.generate_stream(prompt, max_new_tokens=new_tokens)])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(PROMPTS[i % len(PROMPTS)]) for i in range(streams)))
    return sum(counts) / (time.perf_counter() - start)


async def client_side(args: argparse.Namespace) -> dict:
    from client import AsyncClient

    counts = [int(s) for s in args.streams.split(",")]
    runs: dict[int, list[float]] = {n: [] for n in counts}
    batches: dict[int, dict] = {}
    async with AsyncClient(args.address, timeout=600) as client:
        await streams_tps(client, max(counts), 8)  # warm-up: connections, code paths
        for n in counts:
            before = scrape_histogram(args.metrics_url, "ts_generation_batch_size") if args.metrics_url else {}
            for _ in range(args.repeats):
                runs[n].append(await streams_tps(client, n, args.new_tokens))
            if args.metrics_url:
                after = scrape_histogram(args.metrics_url, "ts_generation_batch_size")
                batches[n] = histogram_delta(before, after)
    return {
        "tokens_per_s": {str(n): [round(x, 1) for x in v] for n, v in runs.items()},
        "median_tokens_per_s": {str(n): round(statistics.median(v), 1) for n, v in runs.items()},
        "decode_batch_size": {str(n): b for n, b in batches.items()},
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.generate_workers", description=__doc__.split("\n")[0])
    p.add_argument("side", choices=["torch", "engine", "client"])
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--address", default="")
    p.add_argument("--metrics-url", default="")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--variant", default="auto", help="graph variant the engine side serves (fp32, optimized, int8, ...)"
    )
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.side == "torch":
        emit(torch_side(args))
    elif args.side == "engine":
        emit(asyncio.run(engine_side(args)))
    else:
        emit(asyncio.run(client_side(args)))


if __name__ == "__main__":
    main()
