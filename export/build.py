"""Model directory builds, one per kind: export, parity gate, variants, manifest.

`build_embedding`, `build_fill_mask`, `build_generation`, `build_translation` (and `build_converted`
for converted folders) make every model directory: fp32 graphs -> the parity gate -> the requested
variants, each measured (export/parity.py) -> tokenizer.json -> model.json, written in a staging
folder and moved into place only when everything passed. tokenizer.json never pads (the service
pads each batch); only an embedding model's truncates, at max_input_tokens as sentence-transformers
does; its post-processor adds exactly the special tokens the model expects, so
`tokenizer.encode(text).ids` is the model's input as is (docs/model-directory.md).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from tokenizers import Tokenizer

from export import fill_mask as fm
from export import gpu_gate, packed, parity
from export import onnx_export as ox
from export.attention import attention_graph
from export.modeldir import GraphFile, publish, staging_dir, write_manifest
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
    figures = {
        **figures,
        "attention_max_abs_diff": attention["attention_max_abs_diff"],
        "attention_ok": attention["ok"],
    }
    return {
        **figures,
        "thresholds": {
            "encoder_min_cos": parity.ENCODER_MIN_COS,
            "logits_max_abs": parity.LOGITS_MAX_ABS,
            "greedy_new_tokens": parity.GREEDY_NEW_TOKENS,
            "attention_max_abs": attention["limit"],
        },
    }


def _derive_variants(
    variants,
    fp32: dict[str, Path],
    staging: Path,
    optimize_args: dict[str, tuple],
    decoder_model: bool,
    measure: Callable[[str, dict[str, Path]], dict],
) -> list[GraphFile]:
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


def build_embedding(
    model,
    tokenizer: Tokenizer,
    out: Path,
    *,
    name: str,
    special_tokens: dict,
    variants=(),
    extra: dict | None = None,
    device: str = "cpu",
    quality_sample: tuple[str, list[str]] | None = None,
) -> ModelDir:
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
        figures["packed"] = packed.embedding_parity(model, paths["packed"], batches, cfg.pad_token_id, variant)
        if not _exact(variant):
            judged = packed.embedding_quality(model, paths["packed"], sample, sample_name, cfg.pad_token_id, variant)
            figures["packed"].update(judged)
            figures["quality_ok"] = figures["quality_ok"] and judged["quality_ok"]
        return figures

    def body(staging: Path) -> dict:
        started = time.perf_counter()
        fp32 = {"encoder": staging / "encoder.onnx", "packed": staging / packed.FILE}
        ox.export_encoder(model, fp32["encoder"])
        packed.export_packed(model, fp32["packed"])
        figures = parity.encoder_parity(model, fp32["encoder"], batches, cfg.pad_token_id)
        figures["packed"] = packed.embedding_parity(model, fp32["packed"], batches, cfg.pad_token_id)
        figures["export_seconds"] = round(time.perf_counter() - started, 2)
        graphs = [GraphFile(role, "fp32", p, *ox.graph_io(p), figures) for role, p in fp32.items()]
        graphs += _derive_variants(
            variants, fp32, staging, dict.fromkeys(fp32, ("bert", cfg.n_heads, cfg.d_model)), False, measure
        )
        attention_graphs, attention = attention_graph(model, staging, batches)
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(
            graphs=graphs,
            name=name,
            kind="embedding",
            architecture={"type": "bert-encoder", **asdict(cfg)},
            special_tokens=special_tokens,
            max_input_tokens=cfg.max_length,
            parity=_parity_figures(figures, attention),
            pooling=cfg.pooling,
            embedding_dim=cfg.d_model,
            extra=extra or {},
        )

    return _build(out, body)


def _prompts(tokenizer: Tokenizer, limit: int, count: int = 4) -> list[list[int]]:
    """Gate prompts of different lengths (at least 1, at most limit tokens)."""
    return [tokenizer.encode(t).ids[: max(1, limit - 3 * i)] for i, t in enumerate(GATE_TEXTS[:count])]


def _exact(variant: str) -> bool:
    """Whether the gate holds the variant to PyTorch's tokens (else to its quality, parity.py)."""
    return parity.VARIANT_LIMITS[variant][2]


def build_generation(
    model,
    tokenizer: Tokenizer,
    out: Path,
    *,
    name: str,
    special_tokens: dict,
    max_input_tokens: int,
    max_output_tokens: int,
    variants=(),
    extra: dict | None = None,
    quality_sample: tuple[str, list[list[int]]] | None = None,
    device: str = "cpu",
    chat_template=None,
) -> ModelDir:
    """quality_sample: (description, token sequences) on which reduced-precision variants are judged
    teacher-forced (default: the gate texts). device "cuda": the fp16 graph is also measured on the
    GPU (export/gpu_gate.py). chat_template: export/convert/chat_template.ChatTemplates, stored beside."""
    cfg = model.config
    tokenizer.no_padding()
    tokenizer.no_truncation()
    prompts = _prompts(tokenizer, min(24, cfg.max_positions - parity.GREEDY_NEW_TOKENS))
    sample_name, sample = quality_sample or (
        f"{len(GATE_TEXTS)} gate texts",
        [tokenizer.encode(t).ids[: cfg.max_positions + 1] for t in GATE_TEXTS],
    )
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
            variants, {"decoder": fp32}, staging, {"decoder": ("gpt2", cfg.n_heads, cfg.d_model)}, True, measure
        )
        long = [s[: cfg.max_positions] for s in sample[:4]]  # up to the whole context
        attention_graphs, attention = attention_graph(model, staging, [prompts, long])
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(
            graphs=graphs,
            name=name,
            kind="generation",
            architecture={"type": "gpt-decoder", **asdict(cfg)},
            special_tokens=special_tokens,
            max_input_tokens=max_input_tokens,
            parity=_parity_figures(figures, attention),
            max_output_tokens=max_output_tokens,
            extra=extra or {},
            chat_template=chat_template.stage(staging) if chat_template is not None else None,
        )

    return _build(out, body)


def build_translation(
    model,
    tokenizer: Tokenizer,
    out: Path,
    *,
    name: str,
    special_tokens: dict,
    max_input_tokens: int,
    max_output_tokens: int,
    variants=(),
    extra: dict | None = None,
    quality_sample: tuple[str, list[tuple[list[int], list[int]]]] | None = None,
    device: str = "cpu",
) -> ModelDir:
    """quality_sample: (description, (source ids, target ids starting with the decoder start token)
    pairs) on which reduced-precision variants are judged teacher-forced (default: the gate sources
    and their PyTorch greedy translations). device "cuda": the fp16 graphs are also measured on the GPU."""
    cfg = model.config
    tokenizer.no_padding()
    tokenizer.no_truncation()
    sources = _prompts(tokenizer, min(32, cfg.max_positions))
    args = (cfg.n_heads, cfg.d_model)

    def body(staging: Path) -> dict:
        started = time.perf_counter()
        fp32 = {
            "encoder": staging / "encoder.onnx",
            "decoder": staging / "decoder.onnx",
            "packed": staging / packed.FILE,
        }
        ox.export_translator(model, fp32["encoder"], fp32["decoder"])
        packed.export_packed(model, fp32["packed"])
        reference = parity.reference_translations(model, sources)  # once, for fp32 and every variant
        figures = parity.translator_parity(model, fp32["encoder"], fp32["decoder"], sources, reference=reference)
        figures["packed"] = packed.translator_parity(
            model, fp32["packed"], fp32["decoder"], sources, reference=reference
        )
        sample_name, sample = quality_sample or (
            f"{len(sources)} gate sources with their PyTorch greedy translations",
            [(s, [cfg.decoder_start_token_id, *r]) for s, r in zip(sources, reference)],
        )

        def measure(variant: str, paths: dict[str, Path]) -> dict:
            figures = parity.translator_parity(
                model, paths["encoder"], paths["decoder"], sources, variant, reference=reference
            )
            if not _exact(variant):
                figures.update(
                    parity.translator_quality(model, paths["encoder"], paths["decoder"], sample, sample_name)
                )
            if variant == "fp16" and device == "cuda":
                figures["cuda"] = gpu_gate.translator_figures(
                    model, paths["encoder"], paths["decoder"], sources, reference
                )
            # the packed encoder's own verdict: the service serves it only where it holds, and a
            # packed graph below its quality never keeps the variant's padded graphs from serving
            figures["packed"] = packed.translator_parity(
                model, paths["packed"], paths["decoder"], sources, variant, reference=reference
            )
            if not _exact(variant):
                figures["packed"].update(
                    packed.translator_quality(
                        model,
                        paths["packed"],
                        paths["decoder"],
                        sample,
                        sample_name,
                        variant,
                        figures["packed"]["alone_max_abs_diff"],
                    )
                )
            return figures

        figures["export_seconds"] = round(time.perf_counter() - started, 2)
        graphs = [GraphFile(role, "fp32", p, *ox.graph_io(p), figures) for role, p in fp32.items()]
        graphs += _derive_variants(
            variants,
            fp32,
            staging,
            {"encoder": ("bert", *args), "decoder": ("gpt2", *args), "packed": ("bert", *args)},
            True,
            measure,
        )
        start = cfg.decoder_start_token_id
        pairs = [(s, [start, *r[: 8 + 5 * i]]) for i, (s, r) in enumerate(zip(sources, reference))]
        attention_graphs, attention = attention_graph(model, staging, [pairs, pairs[1:3]])
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(
            graphs=graphs,
            name=name,
            kind="translation",
            architecture={"type": "seq2seq", **asdict(cfg)},
            special_tokens=special_tokens,
            max_input_tokens=max_input_tokens,
            parity=_parity_figures(figures, attention),
            max_output_tokens=max_output_tokens,
            extra=extra or {},
        )

    return _build(out, body)


def build_converted(
    converted, out: Path, *, name: str, variants=(), device: str = "cpu", extra: dict | None = None
) -> ModelDir:
    """A checkpoint converted onto our modules (export/convert/) -> a model directory, through the gate."""
    c = converted
    info = {"converted_from": c.source, **(extra or {})}
    if len(c.eos_token_ids) > 1:  # several end tokens (Llama 3); special_tokens' eos is the first
        info["eos_token_ids"] = c.eos_token_ids
    common = dict(name=name, special_tokens=c.special_tokens, variants=variants, extra=info)
    if c.kind == "embedding":
        return build_embedding(c.model, c.tokenizer, out, device=device, **common)
    if c.kind == "fill-mask":
        return build_fill_mask(c.model, c.tokenizer, out, max_input_tokens=c.max_input_tokens, **common)
    build = build_generation if c.kind == "generation" else build_translation
    return build(
        c.model,
        c.tokenizer,
        out,
        max_input_tokens=c.max_input_tokens,
        max_output_tokens=c.max_output_tokens,
        device=device,
        **common,
        **({"chat_template": c.chat_template} if c.chat_template is not None else {}),
    )


def build_fill_mask(
    model,
    tokenizer: Tokenizer,
    out: Path,
    *,
    name: str,
    special_tokens: dict,
    max_input_tokens: int,
    variants=(),
    extra: dict | None = None,
    quality_texts: tuple[str, Sequence[str]] | None = None,
) -> ModelDir:
    """fp32 graph -> gate -> variants -> attention graph -> tokenizer.json -> model.json (kind fill-mask).

    The tokenizer does not truncate: the service refuses inputs over max_input_tokens (a truncated
    input could lose its [MASK]). quality_texts: (description, texts) for judging fp16 / int8
    (default: the gate texts)."""
    cfg, pad = model.config, special_tokens["pad"]
    tokenizer.no_padding()
    tokenizer.no_truncation()
    seqs = [tokenizer.encode(t).ids[:max_input_tokens] for t in GATE_TEXTS + fm.MASK_TEXTS]
    batches = [seqs, seqs[:3], seqs[-4:], [seqs[6]]]  # mixed lengths, one up to max_input_tokens
    description, texts = quality_texts or (f"{len(GATE_TEXTS)} gate texts", GATE_TEXTS)
    sample = fm.masked_sample(tokenizer, texts, special_tokens["mask"], max_input_tokens)
    description = f"{description}, every {fm.MASK_EVERY}th token masked"

    def measure(variant: str, paths: dict[str, Path]) -> dict:
        figures = fm.fill_mask_parity(model, paths["encoder"], batches, pad, variant)
        if not _exact(variant):
            figures.update(fm.fill_mask_quality(model, paths["encoder"], sample, description, pad))
        figures["packed"] = packed.fill_mask_parity(model, paths["packed"], batches, pad, variant)
        if not _exact(variant):
            judged = packed.fill_mask_quality(model, paths["packed"], sample, description, pad, variant)
            figures["packed"].update(judged)
            figures["quality_ok"] = figures["quality_ok"] and judged["quality_ok"]
        return figures

    def body(staging: Path) -> dict:
        started = time.perf_counter()
        fp32 = {"encoder": staging / "encoder.onnx", "packed": staging / packed.FILE}
        fm.export_fill_mask(model, fp32["encoder"])
        packed.export_packed(model, fp32["packed"])
        figures = fm.fill_mask_parity(model, fp32["encoder"], batches, pad)
        figures["packed"] = packed.fill_mask_parity(model, fp32["packed"], batches, pad)
        figures["export_seconds"] = round(time.perf_counter() - started, 2)
        graphs = [GraphFile(role, "fp32", p, *ox.graph_io(p), figures) for role, p in fp32.items()]
        graphs += _derive_variants(
            variants, fp32, staging, dict.fromkeys(fp32, ("bert", cfg.n_heads, cfg.d_model)), False, measure
        )
        attention_graphs, attention = attention_graph(model.encoder, staging, batches)
        graphs += attention_graphs
        tokenizer.save(str(staging / "tokenizer.json"))
        return dict(
            graphs=graphs,
            name=name,
            kind="fill-mask",
            architecture={"type": "bert-mlm", **asdict(cfg)},
            special_tokens=special_tokens,
            max_input_tokens=max_input_tokens,
            parity=_parity_figures(figures, attention),
            extra=extra or {},
        )

    return _build(out, body)
