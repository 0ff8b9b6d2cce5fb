"""What each kind adds to a model directory build (export/build.py): its graphs and their gate.

One class per kind, all with the shape of `Kind`: the fp32 graph files by role, how to export
them, the optimizer's arguments per role, whether fp16 graphs take float16 inputs, how one
variant's graphs are measured against the PyTorch model (`measure`, the same for fp32 and every
variant), what the attention graph runs on, and the kind's own manifest fields. The constructor
prepares the tokenizer (it never pads; only an embedding model's truncates, at its max_length, as
sentence-transformers does) and the gate's inputs from GATE_TEXTS, and holds the quality sample on
which reduced-precision variants are judged (default: the gate texts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer

from export.gate import gpu_gate, parity
from export.models.decoder_embedder import DecoderEmbedder
from export.onnx import classifier as cls
from export.onnx import decoder_embedder, packed
from export.onnx import fill_mask as fm
from export.onnx import graphs as ox
from export.onnx import sparse as sp
from export.onnx.attention import Model as AttentionModel

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
ENCODER_FILES = {"encoder": "encoder.onnx", "packed": packed.FILE}


@dataclass(frozen=True)
class Request:
    """What the caller declares beside the model and its tokenizer. quality_sample: (description,
    items) on which reduced-precision variants are judged: texts (embedding, fill-mask), token
    sequences (generation, teacher-forced), (source ids, target ids from the decoder start token)
    pairs (translation). device "cuda": fp16 graphs are also measured on the GPU (gate/gpu_gate.py)."""

    special_tokens: dict[str, int]
    max_input_tokens: int | None = None  # embedding: its config's max_length
    max_output_tokens: int | None = None  # generation, translation
    quality_sample: tuple[str, Sequence[Any]] | None = None
    device: str = "cpu"


class Kind(Protocol):
    """A kind's part of a build; `fields` holds max_input_tokens and the kind's other manifest fields
    (its `extra`, if any, joins the caller's extra)."""

    architecture: str  # the manifest's architecture type
    files: dict[str, str]  # role -> fp32 graph file
    optimize: dict[str, tuple[str, int, int]]  # role -> make_optimized's (model type, heads, d_model)
    decoder_io: bool  # fp16 graphs take and return float16 (decoders' KV); encoders keep float32 I/O
    decoder_only: bool  # one decoder graph (generation): int4 is built and the CPU variants timed

    @property
    def attention(self) -> tuple[AttentionModel, list]: ...  # the module and the batches of the attention graph

    @property
    def fields(self) -> dict[str, Any]: ...

    def export(self, paths: dict[str, Path]) -> None: ...

    def measure(self, variant: str, paths: dict[str, Path]) -> dict: ...


def exact(variant: str) -> bool:
    """Whether the gate holds the variant to PyTorch's tokens (else to its quality, gate/parity.py)."""
    return parity.VARIANT_LIMITS[variant][2]


def _prompts(tokenizer: Tokenizer, limit: int, count: int = 4) -> list[list[int]]:
    """Gate prompts of different lengths (at least 1, at most limit tokens)."""
    return [tokenizer.encode(t).ids[: max(1, limit - 3 * i)] for i, t in enumerate(GATE_TEXTS[:count])]


class Embedding:
    """A BERT-style `SentenceEncoder`, or a `DecoderEmbedder` (a causal decoder body, last-token
    pooling: its graphs in export/onnx/decoder_embedder.py), gated alike."""

    def __init__(self, model, tokenizer: Tokenizer, request: Request):
        self.decoder_only = False
        self.decoder = isinstance(model, DecoderEmbedder)
        self.architecture = "decoder-embedder" if self.decoder else model.architecture_type
        self.files, self.decoder_io = dict(ENCODER_FILES), False
        cfg = model.config
        if request.max_input_tokens not in (None, cfg.max_length):
            raise ValueError(f"an embedding model takes its config's max_length ({cfg.max_length}) inputs")
        tokenizer.no_padding()
        tokenizer.enable_truncation(cfg.max_length)
        seqs = [tokenizer.encode(t).ids for t in GATE_TEXTS]
        self.batches = [seqs, seqs[:3], seqs[5:7], [seqs[-1]]]  # mixed lengths; the long one truncated
        self.sample_name, texts = request.quality_sample or (f"{len(GATE_TEXTS)} gate texts", GATE_TEXTS)
        self.sample = [e.ids for e in tokenizer.encode_batch(list(texts))]
        self.model, self.pad, self.device = model, cfg.pad_token_id, request.device
        self.optimize = dict.fromkeys(self.files, ("gpt2" if self.decoder else "bert", cfg.n_heads, cfg.d_model))
        self.attention = (model.decoder if self.decoder else model, self.batches)
        self.fields = {"max_input_tokens": cfg.max_length, "pooling": cfg.pooling, "embedding_dim": cfg.d_model}
        self.reference = parity.EmbeddingReference(model, self.pad)  # PyTorch's rows, once for every variant

    def export(self, paths: dict[str, Path]) -> None:
        if self.decoder:
            decoder_embedder.export(self.model, paths)
            return
        ox.export_encoder(self.model, paths["encoder"])
        packed.export_packed(self.model, paths["packed"])

    def measure(self, variant: str, paths: dict[str, Path]) -> dict:
        model, pad, ref = self.model, self.pad, self.reference
        figures = parity.encoder_parity(model, paths["encoder"], self.batches, pad, variant, reference=ref)
        if not exact(variant):
            figures.update(
                parity.encoder_quality(
                    model, paths["encoder"], self.sample, self.sample_name, pad, variant=variant, reference=ref
                )
            )
        if variant == "fp16" and self.device == "cuda":
            figures["cuda"] = gpu_gate.encoder_figures(model, paths["encoder"], self.batches, pad)
        figures["packed"] = packed.embedding_parity(model, paths["packed"], self.batches, pad, variant, reference=ref)
        if not exact(variant):
            judged = packed.embedding_quality(
                model, paths["packed"], self.sample, self.sample_name, pad, variant, reference=ref
            )
            figures["packed"].update(judged)
            figures["quality_ok"] = figures["quality_ok"] and judged["quality_ok"]
        return figures


class FillMask:
    """The tokenizer does not truncate: the service refuses inputs over max_input_tokens (a
    truncated input could lose its [MASK]); the quality sample is texts, every MASK_EVERY-th token masked."""

    def __init__(self, model, tokenizer: Tokenizer, request: Request):
        self.decoder_only = False
        self.architecture, self.files, self.decoder_io = model.architecture_type, dict(ENCODER_FILES), False
        cfg, limit, special = model.config, request.max_input_tokens, request.special_tokens
        if limit is None:
            raise ValueError("a fill-mask model needs max_input_tokens (its tokenizer does not truncate)")
        self.model, self.pad = model, special["pad"]
        tokenizer.no_padding()
        tokenizer.no_truncation()
        seqs = [tokenizer.encode(t).ids[:limit] for t in GATE_TEXTS + fm.MASK_TEXTS]
        self.batches = [seqs, seqs[:3], seqs[-4:], [seqs[6]]]  # mixed lengths, one up to max_input_tokens
        description, texts = request.quality_sample or (f"{len(GATE_TEXTS)} gate texts", GATE_TEXTS)
        self.sample = fm.masked_sample(tokenizer, texts, special["mask"], limit)
        self.description = f"{description}, every {fm.MASK_EVERY}th token masked"
        self.optimize = dict.fromkeys(self.files, ("bert", cfg.n_heads, cfg.d_model))
        self.attention = (model.encoder, self.batches)
        self.fields = {"max_input_tokens": limit}

    def export(self, paths: dict[str, Path]) -> None:
        fm.export_fill_mask(self.model, paths["encoder"])
        packed.export_packed(self.model, paths["packed"])

    def measure(self, variant: str, paths: dict[str, Path]) -> dict:
        model, pad, sample, description = self.model, self.pad, self.sample, self.description
        figures = fm.fill_mask_parity(model, paths["encoder"], self.batches, pad, variant)
        if not exact(variant):
            figures.update(fm.fill_mask_quality(model, paths["encoder"], sample, description, pad, variant))
        figures["packed"] = packed.fill_mask_parity(model, paths["packed"], self.batches, pad, variant)
        if not exact(variant):
            judged = packed.fill_mask_quality(model, paths["packed"], sample, description, pad, variant)
            figures["packed"].update(judged)
            figures["quality_ok"] = figures["quality_ok"] and judged["quality_ok"]
        return figures


class Generation:
    """Gate prompts fit the context with GREEDY_NEW_TOKENS to spare; the quality sample is token
    sequences judged teacher-forced; PyTorch's greedy reference is computed once for every variant."""

    def __init__(self, model, tokenizer: Tokenizer, request: Request):
        self.decoder_only = True
        self.architecture, self.files, self.decoder_io = "gpt-decoder", {"decoder": "decoder.onnx"}, True
        cfg, self.model, self.device = model.config, model, request.device
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.prompts = _prompts(tokenizer, min(24, cfg.max_positions - parity.GREEDY_NEW_TOKENS))
        self.sample_name, sample = request.quality_sample or (
            f"{len(GATE_TEXTS)} gate texts",
            [tokenizer.encode(t).ids[: cfg.max_positions + 1] for t in GATE_TEXTS],
        )
        self.sample = [s for s in sample if len(s) > 1]
        self.optimize = {"decoder": ("gpt2", cfg.n_heads, cfg.d_model)}
        long = [s[: cfg.max_positions] for s in self.sample[:4]]  # up to the whole context
        self.attention = (model, [self.prompts, long])
        self.fields = {"max_input_tokens": request.max_input_tokens, "max_output_tokens": request.max_output_tokens}

    @cached_property
    def reference(self) -> list[list[int]]:
        return parity.reference_generations(self.model, self.prompts)

    @cached_property
    def forced(self) -> parity.ForcedReference:
        return parity.ForcedReference.decoder(self.model)

    def export(self, paths: dict[str, Path]) -> None:
        ox.export_decoder(self.model, paths["decoder"])

    def measure(self, variant: str, paths: dict[str, Path]) -> dict:
        model, graph = self.model, paths["decoder"]
        figures = parity.decoder_parity(model, graph, self.prompts, variant, reference=self.reference)
        if not exact(variant):
            figures.update(
                parity.decoder_quality(model, graph, self.sample, self.sample_name, variant, reference=self.forced)
            )
        if variant == "fp16" and self.device == "cuda":
            figures["cuda"] = gpu_gate.decoder_figures(model, graph, self.prompts, self.reference)
        return figures


class Translation:
    """Gate sources from the gate texts; the default quality sample is those sources with their
    PyTorch greedy translations; the packed encoder gets its own verdict (below)."""

    def __init__(self, model, tokenizer: Tokenizer, request: Request):
        self.decoder_only = False
        self.architecture, self.decoder_io = "seq2seq", True
        self.files = {"encoder": "encoder.onnx", "decoder": "decoder.onnx", "packed": packed.FILE}
        cfg, self.model, self.device, self.quality_sample = model.config, model, request.device, request.quality_sample
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.sources = _prompts(tokenizer, min(32, cfg.max_positions))
        args = (cfg.n_heads, cfg.d_model)
        self.optimize = {"encoder": ("bert", *args), "decoder": ("gpt2", *args), "packed": ("bert", *args)}
        self.fields = {"max_input_tokens": request.max_input_tokens, "max_output_tokens": request.max_output_tokens}

    @cached_property
    def reference(self) -> list[list[int]]:
        return parity.reference_translations(self.model, self.sources)

    @cached_property
    def forced(self) -> parity.ForcedReference:
        return parity.ForcedReference.translator(self.model)

    @cached_property
    def sample(self) -> tuple[str, Sequence[Any]]:
        start = self.model.config.decoder_start_token_id
        return self.quality_sample or (
            f"{len(self.sources)} gate sources with their PyTorch greedy translations",
            [(s, [start, *r]) for s, r in zip(self.sources, self.reference)],
        )

    @property
    def attention(self) -> tuple[AttentionModel, list]:
        start = self.model.config.decoder_start_token_id
        pairs = [(s, [start, *r[: 8 + 5 * i]]) for i, (s, r) in enumerate(zip(self.sources, self.reference))]
        return self.model, [pairs, pairs[1:3]]

    def export(self, paths: dict[str, Path]) -> None:
        ox.export_translator(self.model, paths["encoder"], paths["decoder"])
        packed.export_packed(self.model, paths["packed"])

    def measure(self, variant: str, paths: dict[str, Path]) -> dict:
        model, sources, ref = self.model, self.sources, self.reference
        encoder, decoder = paths["encoder"], paths["decoder"]
        figures = parity.translator_parity(model, encoder, decoder, sources, variant, reference=ref)
        if not exact(variant):
            figures.update(
                parity.translator_quality(
                    model, encoder, decoder, self.sample[1], self.sample[0], variant=variant, reference=self.forced
                )
            )
        if variant == "fp16" and self.device == "cuda":
            figures["cuda"] = gpu_gate.translator_figures(model, encoder, decoder, sources, ref)
        # the packed encoder's own verdict: the service serves it only where it holds, and a
        # packed graph below its quality never keeps the variant's padded graphs from serving
        figures["packed"] = packed.translator_parity(model, paths["packed"], decoder, sources, variant, reference=ref)
        if not exact(variant):
            alone, peak = figures["packed"]["alone_max_abs_diff"], figures["packed"]["cross_kv_peak"]
            figures["packed"].update(
                packed.translator_quality(
                    model, paths["packed"], decoder, self.sample[1], self.sample[0], variant, alone, peak, self.forced
                )
            )
        return figures


class Classification:
    """Gate batches of (ids, type ids): single texts, and pairs of one query with every gate text
    (one pair long enough to be truncated). The tokenizer truncates pairs at max_length as the
    folder does (longest first, transformers' `truncation=True`, or only_second); the manifest's
    extra.labels and extra.activation tell the service how to read the logits
    (export/onnx/classifier.py), extra.truncation how to cut pairs."""

    def __init__(self, model, tokenizer: Tokenizer, request: Request):
        self.decoder_only = False
        self.architecture, self.files, self.decoder_io = model.architecture_type, dict(ENCODER_FILES), False
        cfg, head = model.config, model.head_config
        tokenizer.no_padding()
        tokenizer.enable_truncation(cfg.max_length)  # a single text: cut at its end
        singles = [(e.ids, e.type_ids) for e in tokenizer.encode_batch(GATE_TEXTS)]
        tokenizer.enable_truncation(cfg.max_length, strategy=head.truncation)
        pairs = [(e.ids, e.type_ids) for e in tokenizer.encode_batch([(GATE_TEXTS[1], t) for t in GATE_TEXTS])]
        self.batches = [singles, pairs, pairs[2:5], [pairs[6]]]  # mixed lengths; pairs[6] truncated
        self.model, self.pad = model, cfg.pad_token_id
        self.optimize = dict.fromkeys(self.files, ("bert", cfg.n_heads, cfg.d_model))
        # the encoder's attention maps (InspectionService): single texts, token type 0, as the RPC reads them
        self.attention = (model.encoder, [[i for i, _ in b] for b in self.batches])
        self.fields = {
            "max_input_tokens": cfg.max_length,
            "extra": {"labels": head.labels, "activation": head.activation, "truncation": head.truncation},
        }

    def export(self, paths: dict[str, Path]) -> None:
        cls.export_classifier(self.model, paths["encoder"])
        cls.export_packed_classifier(self.model, paths["packed"])

    def measure(self, variant: str, paths: dict[str, Path]) -> dict:
        return cls.both(self.model, paths, self.batches, self.pad, variant)


class SparseEmbedding:
    """One padded graph (export/onnx/sparse.py); the tokenizer truncates at max_length, as
    sentence-transformers' SparseEncoder does; embedding_dim is the vocabulary (the sparse vectors' width)."""

    def __init__(self, model, tokenizer: Tokenizer, request: Request):
        self.decoder_only = False
        self.architecture, self.files, self.decoder_io = "bert-splade", {"encoder": "encoder.onnx"}, False
        cfg = model.config
        tokenizer.no_padding()
        tokenizer.enable_truncation(cfg.max_length)
        seqs = [tokenizer.encode(t).ids for t in GATE_TEXTS]
        self.batches = [seqs, seqs[:3], seqs[5:7], [seqs[-1]]]  # mixed lengths; the long one truncated
        self.model, self.pad = model, cfg.pad_token_id
        self.optimize = {"encoder": ("bert", cfg.n_heads, cfg.d_model)}
        self.attention = (model.mlm.encoder, self.batches)
        self.fields = {
            "max_input_tokens": cfg.max_length,
            "embedding_dim": cfg.vocab_size,
            "extra": {"splade": {"pooling": model.splade.pooling, "activation": model.splade.activation}},
        }

    def export(self, paths: dict[str, Path]) -> None:
        sp.export_sparse(self.model, paths["encoder"])

    def measure(self, variant: str, paths: dict[str, Path]) -> dict:
        return sp.sparse_parity(self.model, paths["encoder"], self.batches, self.pad, variant)


KINDS: dict[str, Callable[[Any, Tokenizer, Request], Kind]] = {
    "embedding": Embedding,
    "fill-mask": FillMask,
    "generation": Generation,
    "translation": Translation,
    "classification": Classification,
    "sparse-embedding": SparseEmbedding,
}
