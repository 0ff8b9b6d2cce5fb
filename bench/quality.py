"""What each servable variant costs in quality, on held-out data, through the serving code; JSON out.

The export gate judges a reduced-precision variant on a sample (export/gate/parity.py); this measures
the whole held-out data, with the figures a user compares models by:
- translation models: sacrebleu BLEU and chrF (multi-reference, the same scoring as
  `python -m export evaluate translator`) of the service's TranslationModel on the Tatoeba test
  split, per variant and beam size;
- generation models: held-out perplexity of each variant's decoder graph, teacher-forced through
  onnxruntime over the same windows as `python -m export evaluate generator`.
The PyTorch figures of the same checkpoint (`export evaluate`) are the baseline; the fp32 /
optimized graphs must reproduce them, int8 may cost a little.

    python -m bench.quality --models models [--variants optimized,int8] [--beam 1 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("bench.quality")


def generation_perplexity(model_dir, variant: str) -> dict:
    """exp(mean next-token NLL) of the variant's graph over the held-out windows (one thread)."""
    from tokenizers import Tokenizer

    from export.gate.parity import forced_logits, log_softmax, onnx_step, session
    from export.train import data

    m = model_dir.manifest
    meta = m.extra.get("training", {})
    tok = Tokenizer.from_file(str(model_dir.file(m.tokenizer["file"])))
    _, held = data.split_stories(data.load_stories(data.DEFAULT_DATA["generator"]), seed=meta.get("seed", 0))
    stream = data.story_stream([e.ids[1:] for e in tok.encode_batch(held)], m.special_tokens["eos"])
    context = int(m.architecture["max_positions"])
    step = onnx_step(session(model_dir.file(m.graph("decoder", variant).file)), max_length=context)
    nll, count, started = 0.0, 0, time.perf_counter()
    for s in range(0, len(stream) - 1, context):
        chunk = stream[s : s + context + 1]
        logits = forced_logits(step, chunk.tolist())  # (T, V) for inputs chunk[:-1]
        nll -= float(log_softmax(logits)[np.arange(len(chunk) - 1), chunk[1:]].sum())
        count += len(chunk) - 1
    return {
        "perplexity": round(math.exp(nll / count), 3),
        "tokens": count,
        "seconds": round(time.perf_counter() - started, 1),
    }


async def translation_scores(model_dir, variant: str, beams: list[int], max_length: int, threads: int) -> dict:
    """BLEU / chrF of the served TranslationModel on the test split, per beam size."""
    from export.train import data
    from export.train.evaluate import translation_scores as score
    from service.runtime import Runtime
    from service.settings import Settings
    from service.translation.model import TranslateOptions, TranslationModel

    m = model_dir.manifest
    meta = m.extra.get("training", {})
    sizes = meta.get("split", {})
    split = data.split_tatoeba(
        data.load_tatoeba(data.DEFAULT_DATA["translator"]),
        seed=meta.get("seed", 0),
        n_test=sizes.get("test", 2000),
        n_dev=sizes.get("dev", 1000),
    )
    sources, refs = [en for en, _ in split.test], [r for _, r in split.test]
    settings = Settings.from_env(
        env={},
        models=str(model_dir.path.parent),
        port=0,
        metrics_port=-1,
        intra_op_threads=threads,
        variant=variant,
        translate_max_beam=max(beams),
    )
    runtime = Runtime(settings)
    engine = TranslationModel.load(model_dir, settings, runtime)
    await engine.start()
    out = {}
    try:
        for beam in beams:
            started = time.perf_counter()
            opts = TranslateOptions(beam_size=beam, max_length=max_length)
            results = await asyncio.gather(
                *[engine.translate(sources[i : i + 16], opts) for i in range(0, len(sources), 16)]
            )
            hyps = [t.text for r in results for t in r.translations]
            figures = score(hyps, refs)
            out["greedy" if beam == 1 else f"beam{beam}"] = {
                "bleu": figures["bleu"],
                "chrf": figures["chrf"],
                "sentences": figures["sentences"],
                "seconds": round(time.perf_counter() - started, 1),
            }
    finally:
        await engine.stop()
        runtime.close()
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n")[0])
    p.add_argument("--models", type=Path, default=Path("models"), help="models root (`make models`)")
    p.add_argument("--variants", default="optimized,int8", help="comma-separated variants to score")
    p.add_argument("--beam", type=int, nargs="+", default=[1, 4], help="translation beam sizes (1 = greedy)")
    p.add_argument("--max-length", type=int, default=64, help="translation max_length per sentence")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from service.manifest import load_model_dir

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    result: dict = {}
    for path in sorted(p for p in args.models.iterdir() if (p / "model.json").is_file()):
        model_dir = load_model_dir(path)
        m = model_dir.manifest
        if m.kind == "embedding" or "training" not in m.extra:
            continue  # quality of the embedding model: tests/export/test_export_minilm.py vs sentence-transformers
        per_variant = {}
        for variant in [v for v in variants if v in m.variants("decoder")]:
            gate = m.graph("decoder", variant).parity
            per_variant[variant] = {
                "gate_quality_ok": gate.get("quality_ok"),
                **(
                    {"perplexity": generation_perplexity(model_dir, variant)}
                    if m.kind == "generation"
                    else asyncio.run(translation_scores(model_dir, variant, args.beam, args.max_length, args.threads))
                ),
            }
        result[m.name] = {
            "kind": m.kind,
            "training_metrics_pytorch": m.extra["training"].get("metrics", {}),
            "variants": per_variant,
        }
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
