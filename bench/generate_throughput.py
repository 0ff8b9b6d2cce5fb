"""Generation throughput, side by side in one run; JSON to stdout.

1. Single-stream greedy decode tokens/s: the service's ONNX engine (GenerationModel: scheduler,
   KV cache, sampling, detokenising; no gRPC) vs the same weights in PyTorch with their KV cache
   (export.decoder.GPTDecoder, fp32, the same thread count). Target >= 3x.
2. Aggregate tokens/s of 8 concurrent GenerateStream calls vs 1, through a real in-process gRPC
   server (continuous batching). Target >= 3x.

Weights: the trained checkpoint (checkpoints/tinystories-gpt) when present, else a randomly
initialised decoder of the default size (DecoderConfig()) with a byte-level BPE tokenizer trained
here on the shared TinyStories sample; it is exported through the real pipeline (parity gate,
optimized variant) into a temporary folder. Random weights rarely emit EOS, so every stream
runs its full max_new_tokens; figures say which weights were used.

    python -m bench.generate_throughput [--checkpoint DIR] [--new-tokens 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from export.build import build_generation
from export.checkpoint import load_checkpoint
from export.decoder import DecoderConfig, GPTDecoder
from export.tokenizer_train import GENERATOR_SPECIAL_TOKENS, train_generator_tokenizer
from service.client import AsyncClient
from service.manifest import load_model_dir
from service.runtime import Runtime
from service.server import Server
from service.settings import Settings
from service.textgen.decoding import SamplingParams
from service.textgen.generator import GenerationModel

log = logging.getLogger("bench.generate")

DEFAULT_CHECKPOINT = Path("checkpoints/tinystories-gpt")
STORIES = Path("/work/shared/data/tinystories/TinyStories-train.first2MiB.txt")
PROMPTS = ["Once upon a time", "One day, a little girl named Lily", "Tom had a big red ball.", "The sun was hot and",
           "There was a cat", "Sam and his mom went to the park", "A bird sat on a tree", "Mia wanted a cookie"]


def build_model(checkpoint: Path, out: Path) -> tuple[GPTDecoder, str]:
    """Exports the checkpoint (or a random model of the default size) into out/<name>."""
    if (checkpoint / "config.json").is_file():
        model, meta = load_checkpoint(checkpoint)
        tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        special, source = meta["special_tokens"], f"trained checkpoint {checkpoint}"
    else:
        texts = STORIES.read_text(encoding="utf-8").split("\n")[:20000]
        tokenizer = train_generator_tokenizer(texts, DecoderConfig().vocab_size)
        torch.manual_seed(0)
        model = GPTDecoder(DecoderConfig(vocab_size=tokenizer.get_vocab_size())).eval()
        special, source = GENERATOR_SPECIAL_TOKENS, "random init, DecoderConfig() size (no trained checkpoint yet)"
    cfg = model.config
    build_generation(model, tokenizer, out / "bench-gpt", name="bench-gpt", special_tokens=special,
                     max_input_tokens=cfg.max_positions // 2, max_output_tokens=cfg.max_positions // 2,
                     variants=("optimized",))
    return model, f"{source}; {model.num_parameters() / 1e6:.1f}M params"


@torch.no_grad()
def torch_decode_tps(model: GPTDecoder, prompt_ids: list[int], new_tokens: int) -> tuple[float, list[int]]:
    """Greedy with the PyTorch KV cache; decode-phase tokens/s (after the first token)."""
    logits, past = model(torch.tensor([prompt_ids]))
    tokens = [int(logits[0, -1].argmax())]
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        position = torch.tensor([[len(prompt_ids) + len(tokens) - 1]])
        logits, past = model(torch.tensor([[tokens[-1]]]), position_ids=position, past=past)
        tokens.append(int(logits[0, -1].argmax()))
    return (new_tokens - 1) / (time.perf_counter() - start), tokens


async def engine_decode_tps(model: GenerationModel, prompt: str, new_tokens: int) -> tuple[float, list[int]]:
    """Greedy through the engine's scheduler; decode-phase tokens/s (after the first token)."""
    handle = model.submit(prompt, SamplingParams(max_new_tokens=new_tokens))
    tokens, first_at = [], None
    async for chunk in handle:
        if first_at is None:
            first_at = time.perf_counter()
        tokens += chunk.token_ids
    return (len(tokens) - 1) / (time.perf_counter() - first_at), tokens


async def single_stream(model: GPTDecoder, model_dir: Path, settings: Settings, args) -> dict:
    """Engine and PyTorch alternate, `rounds` times each; best of each (least disturbed by other load)."""
    runtime = Runtime(settings)
    engine = GenerationModel.load(load_model_dir(model_dir), settings, runtime)
    await engine.start()
    await engine.warmup()
    prompt_ids = engine.tokenizer.encode(PROMPTS[0]).ids
    onnx, ref = [], []
    for _ in range(args.rounds):
        tps, engine_tokens = await engine_decode_tps(engine, PROMPTS[0], args.new_tokens)
        onnx.append(tps)
        tps, torch_tokens = torch_decode_tps(model, prompt_ids, len(engine_tokens))
        ref.append(tps)
    await engine.stop()
    runtime.close()
    return {"onnx_engine_tokens_per_s": round(max(onnx), 1), "torch_kv_cache_tokens_per_s": round(max(ref), 1),
            "ratio": round(max(onnx) / max(ref), 2), "target": 3.0, "same_tokens": engine_tokens == torch_tokens,
            "new_tokens": len(engine_tokens), "rounds": {"onnx": [round(x, 1) for x in onnx], "torch": [round(x, 1) for x in ref]}}


async def concurrency(settings: Settings, args) -> dict:
    """1 stream and `streams` concurrent streams alternate through one real server; best of each."""
    server = await Server.start(settings)
    results: dict[int, list[dict]] = {1: [], args.streams: []}
    try:
        async with AsyncClient(server.address, timeout=600) as client:
            await client.generate("warm up", max_new_tokens=4)
            for _ in range(args.rounds):
                for streams in results:
                    results[streams].append(await server_tps(client, streams, args.new_tokens))
    finally:
        await server.shutdown(grace=0)
    one, many = (max(r, key=lambda x: x["tokens_per_s"]) for r in results.values())
    return {"one": one, "many": many, "ratio": round(many["tokens_per_s"] / one["tokens_per_s"], 2), "target": 3.0}


async def server_tps(client: AsyncClient, streams: int, new_tokens: int) -> dict:
    """Aggregate tokens/s of `streams` concurrent GenerateStream calls."""

    async def one(prompt: str) -> int:
        return sum([len(c.token_ids) async for c in client.generate_stream(prompt, max_new_tokens=new_tokens)])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(PROMPTS[i % len(PROMPTS)]) for i in range(streams)))
    elapsed = time.perf_counter() - start
    return {"streams": streams, "tokens": sum(counts), "seconds": round(elapsed, 3),
            "tokens_per_s": round(sum(counts) / elapsed, 1)}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.generate_throughput", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads = torch threads")
    p.add_argument("--rounds", type=int, default=3, help="alternating repetitions; the best of each is reported")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-gpt-") as tmp:
        model, source = build_model(args.checkpoint, Path(tmp))
        settings = Settings.from_env(env={}, models=tmp, port=0, metrics_port=-1, intra_op_threads=args.threads,
                                     gen_max_batch=max(16, args.streams))
        single = await single_stream(model, Path(tmp) / "bench-gpt", settings, args)
        many = await concurrency(settings, args)
    return {"weights": source, "threads": args.threads, "single_stream": single, "concurrency": many,
            "note": "best of `rounds` alternating runs; the CPU is shared with a training job, figures are noisy"}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = asyncio.run(run(parse_args(sys.argv[1:] if argv is None else argv)))
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
