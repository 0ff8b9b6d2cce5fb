"""Model directory builds: one builder for every kind (export, parity gate, variants, manifest).

`build_model_dir(kind, model, tokenizer, out, ...)` (and `build_converted` for converted folders)
makes every model directory: fp32 graphs -> the parity gate -> the requested variants, each
measured (export/gate/parity.py) -> the attention graph -> tokenizer.json -> model.json, written in
a staging folder and moved into place only when everything passed. What differs between kinds
(graph files, gate, attention inputs, tokenizer policy, manifest fields) is the kind's class in
export/kinds.py. tokenizer.json's post-processor adds exactly the special tokens the model
expects, so `tokenizer.encode(text).ids` is the model's input as is (docs/model-directory.md).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from export import memory
from export.gate import parity, speed
from export.kinds import KINDS, Kind, Request
from export.modeldir import TOKENIZER_FILE, GraphFile, publish, staging_dir, write_manifest
from export.onnx import graphs as ox
from export.onnx import store
from export.onnx.attention import attention_graph
from export.onnx.nbits import DEFAULT_INT4, Int4Settings
from service.manifest import ModelDir

log = logging.getLogger(__name__)

VARIANT_ORDER = ("optimized", "fp16", "int8", "int4")
CPU_VARIANTS = ("fp32", "optimized", "int8", "int4")  # timed for `auto` on the CPU (fp16 is the GPU's)


def _parity_figures(figures: dict, attention: dict) -> dict:
    """The model's gate figures: its fp32 graph's, plus the attention graph's largest difference
    (and whether it passed: a graph over the limit is left out, export/onnx/attention.py)."""
    figures = {
        **figures,
        "attention_max_abs_diff": attention["attention_max_abs_diff"],
        "attention_ok": attention["ok"],
        **({"attention_skipped": attention["skipped"]} if "skipped" in attention else {}),
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
    variants, fp32: dict[str, Path], staging: Path, kind: Kind, int4: Int4Settings = DEFAULT_INT4
) -> list[GraphFile]:
    """Build the requested variants of every role's fp32 graph; measure each; -> GraphFiles.

    fp16 starts from the optimized graph when it was built (fused graphs run faster), and so does a
    decoder's int8; an encoder's int8 starts from fp32, whose attention projections are plain
    MatMuls (the optimized graph folds them into one fused Attention node that the row-wise
    quantiser leaves alone). int8 is row-wise for every kind (batch-invariant, graphs.make_int8).
    int4 (block-wise weight-only `MatMulNBits`, graphs.make_int4) is built for generation models
    only (`kind.decoder_only`) and from the optimized graph too, with `int4`'s settings; other kinds
    skip it. A model whose
    fp32 graph is past 2 GiB (export/onnx/store.py) gets no optimized graph, and its variants start
    from fp32: at that size fusing does not pay. A 1.1B Llama's graph optimized with its weights held
    aside (graphs.make_optimized) fuses 44 SkipSimplifiedLayerNormalization, and its decode steps
    take the same time as fp32's (1 row 173-178 against 171-194 ms, 8 rows 265-278 against
    268-282), where the variant would cost 4.4 GB on disk and minutes of gate. Embedding
    tables are 8-bit in int8 and int4 (export/onnx/tables.py), a translator's included.
    kind.decoder_io (generation, translation): fp16 graphs take and return float16 tensors; an
    encoder keeps float32 inputs and outputs in fp16.
    """
    graphs, base = [], dict(fp32)
    for variant in [v for v in VARIANT_ORDER if v in variants]:
        if variant == "int4" and not kind.decoder_only:
            log.info("int4: built for generation models only; skipped for this model")
            continue
        if variant == "optimized" and any(store.past_protobuf(p) for p in fp32.values()):
            log.info(
                "optimized: skipped for a graph past 2 GiB: fused, a 1.1B decoder steps as fast as its fp32 "
                "graph, so the variant would be 4.4 GB on disk and a gate for nothing"
            )
            continue
        paths = {role: staging / f"{role}.{variant}.onnx" for role in fp32}
        started = time.perf_counter()
        extra: dict[str, Any] = {}
        for role, dst in paths.items():
            if variant == "optimized":
                extra[f"{role}_fused_ops"] = ox.make_optimized(base[role], dst, *kind.optimize[role])
            elif variant == "fp16":
                ox.make_fp16(base[role], dst, keep_io_types=not kind.decoder_io)
            elif variant == "int4":
                extra["int4"] = ox.make_int4(base[role], dst, int4)
            else:
                extra["int8_method"] = "rowwise"
                src = base[role] if kind.decoder_io else fp32[role]
                extra.setdefault("tables", {})[role] = ox.make_int8(src, dst)
        memory.release()  # the source graph's copy, loaded to build this one
        figures = {**kind.measure(variant, paths), **extra, "build_seconds": round(time.perf_counter() - started, 2)}
        if variant == "int8" and not kind.decoder_io and figures.get("quality_ok") is False:
            figures = _int8_down_fp32(kind, fp32, paths, figures, started)
        if figures.get("quality_ok") is False:  # kept for whoever asks by name; never served by `auto`
            log.warning(
                "%s: below the quality gate's limits, `auto` will not serve it: %s",
                variant,
                figures.get("quality", figures),
            )
        graphs += [GraphFile(role, variant, p, *ox.graph_io(p), figures) for role, p in paths.items()]
        memory.release()  # the gate's sessions
        if variant == "optimized":
            base = paths
    return graphs


def _int8_down_fp32(kind: Kind, fp32: dict[str, Path], paths: dict[str, Path], full: dict, started: float) -> dict:
    """An encoder whose int8 missed the gate, built again with its down projections in fp32 (the
    feed-forward products that narrow their input read the widest activations, after the GELU,
    whose outliers a per-row 8-bit scale flattens) and gated again; kept where it passes, with
    the first try's figures under `int8_all`; else the first try stays, this one's figures under
    `int8_down_fp32`. all-MiniLM-L6-v2 (Intel Xeon): cos min 0.9734 -> 0.983, mean 0.9933 -> 0.9952
    (limits 0.98, 0.995); 16 x 40 tokens 42.4 ms all int8, 55.9 ms so, 103.5 ms optimized fp32."""
    folder = next(iter(paths.values())).parent / ".int8-down-fp32"  # same file names: a data file's name holds
    folder.mkdir()
    trial = {role: folder / p.name for role, p in paths.items()}
    tables = {role: ox.make_int8(fp32[role], dst, keep_down=True) for role, dst in trial.items()}
    figures = kind.measure("int8", trial)
    if not figures.get("quality_ok"):
        log.info("int8 with down projections in fp32 misses the gate too: %s", figures.get("quality", figures))
        shutil.rmtree(folder)
        return {**full, "int8_down_fp32": {"quality": figures.get("quality"), "quality_ok": False}}
    for role, p in trial.items():
        store.data_file(paths[role]).unlink(missing_ok=True)
        for f in store.files(p):
            f.replace(paths[role].parent / f.name)
    folder.rmdir()
    log.info("int8: the down projections stay fp32, which passes the gate: %s", figures.get("quality", figures))
    return {
        **figures,
        "int8_method": "rowwise, down projections fp32",
        "tables": tables,
        "int8_all": {"quality": full.get("quality"), "quality_ok": False},
        "build_seconds": round(time.perf_counter() - started, 2),
    }


def _graphs(kind: Kind, staging: Path, variants, int4: Int4Settings = DEFAULT_INT4) -> tuple[list[GraphFile], dict]:
    """fp32 graphs, gated; their variants; the attention graph -> (GraphFiles, the model's parity figures)."""
    started = time.perf_counter()
    fp32 = {role: staging / file for role, file in kind.files.items()}
    kind.export(fp32)
    memory.release()  # the export's protobuf
    figures = kind.measure("fp32", fp32)
    figures["export_seconds"] = round(time.perf_counter() - started, 2)
    graphs = [GraphFile(role, "fp32", p, *ox.graph_io(p), figures) for role, p in fp32.items()]
    graphs += _derive_variants(variants, fp32, staging, kind, int4)
    module, batches = kind.attention
    attention_graphs, attention = attention_graph(module, staging, batches)
    model_figures = _parity_figures(figures, attention)
    if kind.decoder_only:  # a generation model: its CPU variants timed for `auto` (export/gate/speed.py)
        timed = {g.variant: g.path for g in graphs if g.variant in CPU_VARIANTS}
        model_figures["speed"] = speed.decode_steps(timed)
    return graphs + attention_graphs, model_figures


def build_model_dir(
    kind: str,
    model: Any,
    tokenizer: Tokenizer,
    out: Path,
    *,
    name: str,
    special_tokens: dict[str, int],
    max_input_tokens: int | None = None,
    max_output_tokens: int | None = None,
    variants=(),
    extra: dict | None = None,
    quality_sample: tuple[str, Sequence[Any]] | None = None,
    device: str = "cpu",
    chat_template: Any = None,
    int4: Int4Settings = DEFAULT_INT4,
) -> ModelDir:
    """A model of the kind -> the model directory out, through the gate. max_input_tokens: an
    embedding model's is its config's max_length; max_output_tokens: generation and translation
    only; quality_sample and device: export.kinds.Request; chat_template (generation only):
    export/convert/chat_template.ChatTemplates, its files stored beside the graphs; int4: the int4
    variant's quantiser settings (export/onnx/nbits.py)."""
    if chat_template is not None and kind != "generation":
        raise ValueError(f"a {kind} model has no chat template (generation models do)")
    request = Request(special_tokens, max_input_tokens, max_output_tokens, quality_sample, device)
    part = KINDS[kind](model, tokenizer, request)
    staging = staging_dir(out)
    try:
        graphs, figures = _graphs(part, staging, variants, int4)
        tokenizer.save(str(staging / TOKENIZER_FILE))
        fields = dict(part.fields)  # after the graphs: a kind may set fields while it exports
        extra = {**(extra or {}), **fields.pop("extra", {})}
        if chat_template is not None:
            fields["chat_template"] = chat_template.stage(staging)
        write_manifest(
            staging,
            graphs=graphs,
            name=name,
            kind=kind,
            architecture={"type": part.architecture, **asdict(model.config)},
            special_tokens=special_tokens,
            parity=figures,
            extra=extra,
            **fields,
        )
        return publish(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def build_converted(
    converted,
    out: Path,
    *,
    name: str,
    variants=(),
    device: str = "cpu",
    extra: dict | None = None,
    int4: Int4Settings = DEFAULT_INT4,
) -> ModelDir:
    """A checkpoint converted onto our modules (export/convert/) -> a model directory, through the gate."""
    c = converted
    info = {"converted_from": c.source, **c.prompts, **(extra or {})}
    if len(c.eos_token_ids) > 1:  # several end tokens (Llama 3); special_tokens' eos is the first
        info["eos_token_ids"] = c.eos_token_ids
    return build_model_dir(
        c.kind,
        c.model,
        c.tokenizer,
        out,
        name=name,
        variants=variants,
        extra=info,
        special_tokens=c.special_tokens,
        max_input_tokens=c.max_input_tokens,
        max_output_tokens=c.max_output_tokens,
        device=device,
        chat_template=c.chat_template,
        int4=int4,
    )
