"""Generation throughput, side by side in one run; JSON to stdout.

1. Single-stream greedy decode tokens/s: the service's GenerationModel (no gRPC) vs the same weights
   in PyTorch with their own KV cache, the same prompt, tokens and thread count.
2. Aggregate tokens/s of `--streams` concurrent GenerateStream calls vs 1 through a real
   `python -m service` (continuous batching; its decode batch-size histogram beside it).
Each side runs in its own process (bench/generate_workers.py); sides alternate `--rounds` times,
figures are medians with spread and ratios are per round. Weights: the trained checkpoint when
present, else a random default-size decoder with a BPE tokenizer trained here, exported through
the real pipeline (random weights rarely emit EOS).

    python -m bench.generate_throughput [--checkpoint DIR] [--new-tokens 128] [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import ServiceProcess, conditions, run_worker, served_quality, snapshot_checkpoint, summary

log = logging.getLogger("bench.generate")

DEFAULT_CHECKPOINT = Path("checkpoints/tinystories-gpt")
STORIES = Path("/work/shared/data/tinystories/TinyStories-train.first2MiB.txt")
WORKERS = "bench.generate_workers"


def build_model(checkpoint: Path, out: Path) -> tuple[Path, str]:
    """Exports the checkpoint (or a random model of the default size) into out/models/bench-gpt;
    returns the checkpoint both sides load and a description of the weights."""
    import torch

    from export.build import build_model_dir
    from export.models.decoder import DecoderConfig, GPTDecoder
    from export.train.checkpoint import save_checkpoint
    from export.train.heldout import heldout_sample
    from export.train.tokenizer_train import GENERATOR_SPECIAL_TOKENS, train_generator_tokenizer

    if (checkpoint / "config.json").is_file():
        checkpoint, model, meta, tokenizer, source = snapshot_checkpoint(checkpoint, out, GPTDecoder)
        special = meta["special_tokens"]
        sample = heldout_sample(meta, model.config, tokenizer, checkpoint)  # as `make models` judges int8
    else:
        texts = STORIES.read_text(encoding="utf-8").split("\n")[:20000]
        tokenizer = train_generator_tokenizer(texts, DecoderConfig().vocab_size)
        tokenizer.save(str(out / "tokenizer.json"))
        torch.manual_seed(0)
        model = GPTDecoder(DecoderConfig(vocab_size=tokenizer.get_vocab_size())).eval()
        special, source = GENERATOR_SPECIAL_TOKENS, "random init, DecoderConfig() size (no trained checkpoint)"
        sample = None
        checkpoint = save_checkpoint(
            model,
            out / "checkpoint",
            name="bench-gpt",
            tokenizer_path=out / "tokenizer.json",
            special_tokens=special,
            max_length=model.config.max_positions,
            fp16=False,
        )
    cfg = model.config
    build_model_dir(
        "generation",
        model,
        tokenizer,
        out / "models" / "bench-gpt",
        name="bench-gpt",
        special_tokens=special,
        max_input_tokens=cfg.max_positions // 2,
        max_output_tokens=cfg.max_positions // 2,
        variants=("optimized", "int8"),
        quality_sample=sample,
    )
    return checkpoint, f"{source}; {model.num_parameters() / 1e6:.1f}M params"


def single_stream_round(checkpoint: Path, model_dir: Path, args) -> dict:
    common = ["--new-tokens", str(args.new_tokens), "--threads", str(args.threads), "--repeats", str(args.repeats)]
    ref = run_worker(WORKERS, "torch", "--checkpoint", str(checkpoint), *common)
    onnx = run_worker(WORKERS, "engine", "--model-dir", str(model_dir), "--variant", args.variant, *common)
    return {
        "onnx": statistics.median(onnx["tokens_per_s"]),
        "torch": statistics.median(ref["tokens_per_s"]),
        "same_tokens": onnx["tokens"] == ref["tokens"],
        "new_tokens": len(onnx["tokens"]),
        "same_prefix": common_prefix(onnx["tokens"], ref["tokens"]),
        "variant": onnx["variant"],
    }


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading greedy tokens two runs share (all of them for fp32; int8 may drift)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def concurrency_round(models: Path, args) -> dict:
    flags = [
        "--intra-op-threads",
        str(args.threads),
        "--gen-max-batch",
        str(max(16, args.streams)),
        "--variant",
        args.variant,
    ]
    service = ServiceProcess(models, flags, metrics=True)
    try:
        out = run_worker(
            WORKERS,
            "client",
            "--address",
            service.address,
            "--metrics-url",
            service.metrics_url,
            "--streams",
            f"1,{args.streams}",
            "--new-tokens",
            str(args.new_tokens),
            "--repeats",
            str(args.repeats),
        )
    finally:
        service.stop()
    one, many = out["median_tokens_per_s"]["1"], out["median_tokens_per_s"][str(args.streams)]
    return {"one": one, "many": many, "batch": out["decode_batch_size"][str(args.streams)]}


def report(single: list[dict], many: list[dict], args) -> dict:
    return {
        "single_stream": {
            "onnx_engine_tokens_per_s": summary([r["onnx"] for r in single], 1),
            "torch_kv_cache_tokens_per_s": summary([r["torch"] for r in single], 1),
            "ratio": summary([r["onnx"] / r["torch"] for r in single]),
            "target": 3.0,
            "same_tokens": all(r["same_tokens"] for r in single),
            "new_tokens": single[0]["new_tokens"],
            "same_prefix_tokens": min(r["same_prefix"] for r in single),
            "variant": single[0]["variant"],
        },
        "concurrency": {
            "one_stream_tokens_per_s": summary([r["one"] for r in many], 1),
            f"{args.streams}_streams_tokens_per_s": summary([r["many"] for r in many], 1),
            "ratio": summary([r["many"] / r["one"] for r in many]),
            "target": 3.0,
            "decode_batch_size_last_round": many[-1]["batch"],
        },
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.generate_throughput", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads = torch threads")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (fresh processes each)")
    p.add_argument("--repeats", type=int, default=3, help="measured generations per worker (after a warm-up)")
    p.add_argument(
        "--variant",
        default="auto",
        help="graph variant of the engine side: auto (what the service "
        "serves here: int8 on CPU when the gate passed its quality), optimized (fp32: PyTorch's exact "
        "tokens) or int8 (quantised weights: same held-out perplexity, greedy tokens may drift)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    before = conditions()
    with tempfile.TemporaryDirectory(prefix="bench-gpt-") as tmp:
        checkpoint, source = build_model(args.checkpoint.resolve(), Path(tmp))
        single, many = [], []
        for _ in range(args.rounds):
            single.append(single_stream_round(checkpoint, Path(tmp) / "models" / "bench-gpt", args))
            many.append(concurrency_round(Path(tmp) / "models", args))
        quality = served_quality(Path(tmp) / "models" / "bench-gpt", single[0]["variant"])
    result = {
        "weights": source,
        "threads": args.threads,
        "rounds": args.rounds,
        **report(single, many, args),
        "quality": quality,
        "conditions": {"before": before, "after": conditions()},
    }
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
