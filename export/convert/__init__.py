"""Bring your own model: a local Hugging Face folder -> a model directory, through the same gates.

`convert(path, out)` reads the folder (export/convert/folder.py), finds its converter in
`ARCHITECTURES` by config.json's `architectures[0]` (a sentence-transformers `modules.json`
makes an encoder or a Llama-family decoder an embedding model, a sparse one with SPLADE pooling),
maps its weights onto the project's own modules (one module per family: bert.py, classifier.py,
modernbert.py, gpt2.py, llama.py with decoder_embedder.py, marian.py, splade.py), checks the result against
transformers' own forward and tokenizer (reference.py), then builds the model directory like
any other (export/build.py: ONNX export, parity gate, variants); an embedder's instruction prompts
(config_sentence_transformers.json) go into the manifest (prompts.py). Anything unsupported raises
`ConversionError` naming the file, field and value before a file is written. Nothing is downloaded.
(The approach of CTranslate2's converters: checkpoints onto the project's own specs.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from export.convert import bert, classifier, gpt2, llama, marian, modernbert, prompts, splade
from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder
from export.onnx.nbits import DEFAULT_INT4, Int4Settings

log = logging.getLogger(__name__)

KINDS = ("embedding", "fill-mask", "generation", "translation", "classification", "sparse-embedding")
MASKED_LM_KINDS = ("fill-mask", "embedding", "sparse-embedding")
# architectures[0] -> (its converter module, the kind it makes by default, kinds it can make)
ARCHITECTURES: dict[str, tuple[ModuleType, str, tuple[str, ...]]] = {
    "BertModel": (bert, "embedding", ("embedding",)),
    "BertForMaskedLM": (bert, "fill-mask", MASKED_LM_KINDS),
    "RobertaModel": (bert, "embedding", ("embedding",)),
    "DistilBertModel": (bert, "embedding", ("embedding",)),
    "DistilBertForMaskedLM": (bert, "fill-mask", MASKED_LM_KINDS),
    "RobertaForMaskedLM": (bert, "fill-mask", MASKED_LM_KINDS),
    "XLMRobertaModel": (bert, "embedding", ("embedding",)),
    "XLMRobertaForMaskedLM": (bert, "fill-mask", MASKED_LM_KINDS),
    "BertForSequenceClassification": (classifier, "classification", ("classification",)),
    "RobertaForSequenceClassification": (classifier, "classification", ("classification",)),
    "XLMRobertaForSequenceClassification": (classifier, "classification", ("classification",)),
    "ModernBertModel": (modernbert, "embedding", ("embedding",)),
    "ModernBertForMaskedLM": (modernbert, "fill-mask", ("fill-mask", "embedding")),
    "ModernBertForSequenceClassification": (modernbert, "classification", ("classification",)),
    "GPT2LMHeadModel": (gpt2, "generation", ("generation",)),
    "LlamaForCausalLM": (llama, "generation", ("generation", "embedding")),
    "MistralForCausalLM": (llama, "generation", ("generation", "embedding")),
    "Qwen2ForCausalLM": (llama, "generation", ("generation", "embedding")),
    "Qwen3ForCausalLM": (llama, "generation", ("generation", "embedding")),
    "LlamaModel": (llama, "embedding", ("embedding",)),
    "MistralModel": (llama, "embedding", ("embedding",)),
    "Qwen2Model": (llama, "embedding", ("embedding",)),
    "Qwen3Model": (llama, "embedding", ("embedding",)),
    "MarianMTModel": (marian, "translation", ("translation",)),
}


@dataclass(frozen=True)
class Options:
    """What the command line may set; None: from the folder."""

    kind: str | None = None
    pooling: str | None = None  # embedding: mean | cls | max
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    chat_template: Path | None = None  # generation: a Jinja file instead of the folder's template
    int4: Int4Settings = DEFAULT_INT4  # generation: the int4 variant's quantiser settings


def family(folder: HFFolder, kind: str | None) -> tuple[ModuleType, str]:
    """-> (converter module, kind); ConversionError for an unknown architecture or kind."""
    arch = folder.architecture
    if arch not in ARCHITECTURES:
        raise refuse(folder.where(), "architectures", arch, sorted(ARCHITECTURES))
    module, default, kinds = ARCHITECTURES[arch]
    if kind is None and "sparse-embedding" in kinds and splade.is_sparse(folder):
        kind = "sparse-embedding"
    if kind is None:
        kind = "embedding" if folder.modules is not None and "embedding" in kinds else default
    if kind not in kinds:
        raise ConversionError(f"{folder.where()}: a {arch} converts to {' or '.join(kinds)}, not {kind!r} (--kind)")
    return (splade if kind == "sparse-embedding" else module), kind


def load(path: str | Path, options: Options = Options()) -> Converted:
    """The folder mapped onto our modules and checked against transformers (no file written)."""
    folder = HFFolder(path)
    converter, kind = family(folder, options.kind)
    converted = converter.load(folder, kind, options)
    if kind in ("embedding", "sparse-embedding"):
        converted.prompts = prompts.read(folder)
    from export.convert import reference

    converted.source["reference"] = reference.check(folder, converted)
    from export import memory

    memory.release()  # transformers' own copy of the model, used by the check
    converted.chat_template = _chat_template(folder, converted, options.chat_template)
    return converted


def _chat_template(folder: HFFolder, converted: Converted, override: Path | None):
    """The folder's (or the override's) chat template, checked against transformers; None without one."""
    from export.convert import chat_template, reference

    if converted.kind != "generation":
        if override is not None:
            raise ConversionError(f"--chat-template: a {converted.kind} model has no chat (generation models do)")
        return None
    templates = chat_template.read(folder, reference.hf_tokenizer(folder), override)
    if templates is None:
        log.info("%s has no chat template (give one with --chat-template FILE)", folder.path)
        return None
    return chat_template.check(folder, templates, converted.tokenizer, override)


def default_name(path: str | Path) -> str:
    return Path(path).resolve().name.lower().replace("_", "-").replace(" ", "-")


def convert(
    path: str | Path,
    out: str | Path,
    *,
    name: str | None = None,
    options: Options = Options(),
    variants=(),
    device: str = "cpu",
    extra: dict | None = None,
):
    """Converts the folder at path into the model directory out (its name: name, else the folder's)."""
    from export.build import build_converted

    converted = load(path, options)
    name = name or default_name(path)
    log.info("converting %s (%s, %s) into %s", path, converted.source.get("architecture"), converted.kind, out)
    return build_converted(
        converted, Path(out), name=name, variants=variants, device=device, extra=extra, int4=options.int4
    )


__all__ = ["ARCHITECTURES", "ConversionError", "Converted", "Options", "convert", "load"]
