"""Translation throughput, side by side in one run; JSON to stdout.

Sentences/s of greedy translation of English test sentences (sorted by length, the same order for
both sides): the service's TranslationModel (its queue batching concurrent calls of `--per-call`
sentences up to `--batch` rows) vs PyTorch greedy on the same weights with its KV cache in batches
of the same size (`ratio`), and the model's own cache-less `greedy_decode` (`ratio_vs_reference`).
`same_tokens` is the share of sentences decoded identically. Each side runs in its own process
(bench/translate_workers.py); sides alternate `--rounds` times, ratios per round. Weights: the
trained checkpoint when present, else random weights (which rarely emit EOS).

    python -m bench.translate_throughput [--checkpoint DIR] [--sentences 128] [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import conditions, run_worker, served_quality, snapshot_checkpoint, summary

log = logging.getLogger("bench.translate")

DEFAULT_CHECKPOINT = Path("checkpoints/tatoeba-en-fr")
WORKERS = "bench.translate_workers"


def build_model(checkpoint: Path, out: Path, split) -> tuple[Path, str]:
    """Exports the checkpoint snapshot (or a random model) into out/models/bench-translate;
    returns the checkpoint both sides load and a description of the weights."""
    import torch

    from export.build import build_model_dir
    from export.models.seq2seq import Seq2SeqConfig, Translator
    from export.train.checkpoint import save_checkpoint
    from export.train.heldout import heldout_sample
    from export.train.tokenizer_train import TRANSLATOR_SPECIAL_TOKENS, train_translator_tokenizer

    if (checkpoint / "config.json").is_file():
        checkpoint, model, meta, tokenizer, source = snapshot_checkpoint(checkpoint, out, Translator)
        special = meta["special_tokens"]
        sample = heldout_sample(meta, model.config, tokenizer, checkpoint)  # as `make models` judges int8
    else:
        texts = [t for en, fr in split.train[:40000] for t in (en, fr)]
        tokenizer = train_translator_tokenizer(texts, Seq2SeqConfig().vocab_size)
        tokenizer.save(str(out / "tokenizer.json"))
        torch.manual_seed(0)
        model = Translator(Seq2SeqConfig(vocab_size=tokenizer.get_vocab_size(), dropout=0.0)).eval()
        special, source = TRANSLATOR_SPECIAL_TOKENS, "random init, Seq2SeqConfig() size (no trained checkpoint)"
        sample = None
        checkpoint = save_checkpoint(
            model,
            out / "checkpoint",
            name="bench-translate",
            special_tokens=special,
            tokenizer_path=out / "tokenizer.json",
            max_length=model.config.max_positions,
            fp16=False,
        )
    cfg = model.config
    build_model_dir(
        "translation",
        model.eval(),
        tokenizer,
        out / "models" / "bench-translate",
        name="bench-translate",
        special_tokens=special,
        max_input_tokens=cfg.max_positions,
        max_output_tokens=cfg.max_positions - 1,
        variants=("optimized", "int8"),
        quality_sample=sample,
    )
    return checkpoint, f"{source}; {model.num_parameters() / 1e6:.1f}M params"


def one_round(checkpoint: Path, model_dir: Path, sentences: Path, args, reference: bool) -> dict:
    common = [
        "--sentences",
        str(sentences),
        "--batch",
        str(args.batch),
        "--per-call",
        str(args.per_call),
        "--max-length",
        str(args.max_length),
        "--threads",
        str(args.threads),
        "--repeats",
        str(args.repeats),
    ]
    ref = run_worker(
        WORKERS, "torch", "--checkpoint", str(checkpoint), *common, *(["--reference"] if reference else [])
    )
    onnx = run_worker(WORKERS, "engine", "--model-dir", str(model_dir), "--variant", args.variant, *common)
    same = sum(a == b for a, b in zip(onnx["tokens"], ref["tokens"])) / len(ref["tokens"])
    return {
        "onnx": statistics.median(onnx["sentences_per_s"]),
        "torch": statistics.median(ref["sentences_per_s"]),
        "reference": ref.get("reference_sentences_per_s", [None])[0],
        "same_tokens": same,
        "variant": onnx["variant"],
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.translate_throughput", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--sentences", type=int, default=128)
    p.add_argument("--per-call", type=int, default=8, help="sentences per translate call (calls run concurrently)")
    p.add_argument("--batch", type=int, default=32, help="translate_max_batch, and the PyTorch batch size")
    p.add_argument("--max-length", type=int, default=48)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads = torch threads")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (fresh processes each)")
    p.add_argument("--repeats", type=int, default=2, help="measured passes per worker (after a warm-up pass)")
    p.add_argument(
        "--variant",
        default="auto",
        help="graph variant of the engine side: auto (what the service "
        "serves on this machine), optimized (fp32) or int8 (quantised weights: tokens may differ)",
    )
    p.add_argument("--no-reference", action="store_true", help="skip the slow no-cache greedy_decode pass")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from export.train import data

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    before = conditions()
    split = data.split_tatoeba(data.load_tatoeba(data.DEFAULT_DATA["translator"]))
    sentences = sorted((en for en, _ in split.test[: args.sentences]), key=len)
    with tempfile.TemporaryDirectory(prefix="bench-translate-") as tmp:
        checkpoint, source = build_model(args.checkpoint.resolve(), Path(tmp), split)
        (Path(tmp) / "sentences.json").write_text(json.dumps(sentences), encoding="utf-8")
        rounds = [
            one_round(
                checkpoint,
                Path(tmp) / "models" / "bench-translate",
                Path(tmp) / "sentences.json",
                args,
                reference=(i == 0 and not args.no_reference),
            )
            for i in range(args.rounds)
        ]
        quality = served_quality(Path(tmp) / "models" / "bench-translate", rounds[0]["variant"])
    result = {
        "weights": source,
        "threads": args.threads,
        "sentences": len(sentences),
        "max_length": args.max_length,
        "batch": args.batch,
        "per_call": args.per_call,
        "rounds": args.rounds,
        "variant": rounds[0]["variant"],
        "onnx_sentences_per_s": summary([r["onnx"] for r in rounds], 1),
        "torch_greedy_kv_cache_sentences_per_s": summary([r["torch"] for r in rounds], 1),
        "ratio": summary([r["onnx"] / r["torch"] for r in rounds]),
        "target": 2.0,
        "same_tokens": min(r["same_tokens"] for r in rounds),
        "quality": quality,
        "conditions": {"before": before, "after": conditions()},
    }
    if rounds[0]["reference"]:
        result["torch_greedy_decode_reference_sentences_per_s"] = rounds[0]["reference"]
        result["ratio_vs_reference"] = round(rounds[0]["onnx"] / rounds[0]["reference"], 2)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
