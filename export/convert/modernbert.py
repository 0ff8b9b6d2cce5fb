"""ModernBERT folders -> `ModernBertEncoder` (embedding), `ModernBertMaskedLM` (fill-mask) or
`ModernBertClassifier` (classification), export/models/modernbert.py.

`ModernBertModel` (gte-modernbert, modernbert-embed: sentence-transformers folders whose pooling,
max_seq_length and prompts are read as for BERT, export/convert/bert.py and prompts.py),
`ModernBertForMaskedLM` and `ModernBertForSequenceClassification` (labels and activation read as
for BERT's classifiers, export/convert/classifier.py). config.json in either of the forms
transformers reads: `layer_types` and `rope_parameters` (transformers 5), or the Hub's older
`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`. Weights: the fused
`Wqkv` is split into query, key and value; GeGLU's `Wi` into its activated half (ours `gate`) and
its linear half (`fc_in`); the masked-LM decoder is the tied token embedding plus its bias.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from export.convert import bert, classifier
from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder, fast_tokenizer
from export.models.classifier import HeadConfig
from export.models.layers import ACTIVATIONS
from export.models.modernbert import (
    LAYER_TYPES,
    POOLINGS,
    ModernBertClassifier,
    ModernBertConfig,
    ModernBertEncoder,
    ModernBertMaskedLM,
)

ROPE_TYPES = ("default",)
_RENAMES = [  # (HF name without "model.", ours under the encoder)
    (r"^embeddings\.tok_embeddings\.", "embeddings.word."),
    (r"^embeddings\.norm\.", "embeddings.norm."),
    (r"^layers\.(\d+)\.attn_norm\.", r"blocks.\1.ln_attn."),
    (r"^layers\.(\d+)\.attn\.Wo\.", r"blocks.\1.attn.out."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"blocks.\1.ln_ffn."),
    (r"^layers\.(\d+)\.mlp\.Wo\.", r"blocks.\1.ffn.fc_out."),
    (r"^final_norm\.", "final_norm."),
]
_SPLITS = {  # fused HF weights -> ours, in the order of their rows
    re.compile(r"^layers\.(\d+)\.attn\.Wqkv\.(weight|bias)$"): ("attn.query", "attn.key", "attn.value"),
    re.compile(r"^layers\.(\d+)\.mlp\.Wi\.(weight|bias)$"): ("ffn.gate", "ffn.fc_in"),  # act(first half) * second
}
_HEADS = {  # kind -> [(HF head name, ours)]
    "fill-mask": [(r"^head\.", "head.transform."), (r"^decoder\.bias$", "head.bias")],
    "classification": [(r"^head\.", "head."), (r"^classifier\.", "classifier.")],
    "embedding": [],
}
_TIED = re.compile(r"^decoder\.weight$")


def _rope_thetas(folder: HFFolder) -> tuple[float, float]:
    """(global, local) rope_theta from `rope_parameters`, else the older fields (their defaults as transformers')."""
    hf, where = folder.config, folder.where()
    params = hf.get("rope_parameters")
    if params is None:
        if hf.get("rope_scaling") is not None:
            raise refuse(where, "rope_scaling", hf["rope_scaling"], [None])
        return float(hf.get("global_rope_theta", 160000.0)), float(hf.get("local_rope_theta", 10000.0))
    thetas = []
    for layer_type in LAYER_TYPES:
        p = params.get(layer_type) or {}
        if p.get("rope_type", "default") not in ROPE_TYPES:
            raise refuse(where, f"rope_parameters.{layer_type}.rope_type", p["rope_type"], ROPE_TYPES)
        thetas.append(float(p["rope_theta"]))
    return thetas[0], thetas[1]


def _layer_types(folder: HFFolder) -> list[str]:
    hf, n = folder.config, int(folder.config["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None:
        every = int(hf.get("global_attn_every_n_layers", 3))
        return ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise refuse(folder.where(), "layer_types", types, [f"{n} of {', '.join(LAYER_TYPES)}"])
    return list(types)


def read_config(folder: HFFolder, options, pipeline: dict) -> ModernBertConfig:
    """ModernBertConfig from config.json (+ a sentence-transformers pipeline's pooling and
    max_length, export/convert/bert.py, and the command line)."""
    hf, where = folder.config, folder.where()
    if hf.get("model_type") != "modernbert":
        raise refuse(where, "model_type", hf.get("model_type"), ["modernbert"])
    for name in ("hidden_activation", "classifier_activation"):
        if hf.get(name, "gelu") not in ACTIVATIONS:
            raise refuse(where, name, hf[name], list(ACTIVATIONS))
    if hf.get("classifier_pooling", "cls") not in POOLINGS:
        raise refuse(where, "classifier_pooling", hf["classifier_pooling"], POOLINGS)
    usable = int(hf["max_position_embeddings"])
    length = options.max_input_tokens or pipeline.get("max_length") or usable
    if length > usable:
        raise ConversionError(f"{where}: max input tokens {length} exceed the model's {usable} positions")
    global_theta, local_theta = _rope_thetas(folder)
    return ModernBertConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        max_positions=usable,
        layer_norm_eps=hf.get("norm_eps", 1e-5),
        norm_bias=bool(hf.get("norm_bias", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        activation=hf.get("hidden_activation", "gelu"),
        layer_types=_layer_types(folder),
        local_window=int(hf.get("local_attention", 128)),
        global_rope_theta=global_theta,
        local_rope_theta=local_theta,
        pooling=options.pooling or pipeline.get("pooling", "mean"),
        max_length=length,
        pad_token_id=int(hf.get("pad_token_id") or 0),
        head_activation=hf.get("classifier_activation", "gelu"),
        head_bias=bool(hf.get("classifier_bias", False)),
        classifier_pooling=hf.get("classifier_pooling", "cls"),
    )


def _rename(key: str, table) -> str | None:
    for pattern, replacement in table:
        new, n = re.subn(pattern, replacement, key)
        if n:
            return new
    return None


def map_weights(folder: HFFolder, state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """The folder's state dict renamed (and fused weights split) onto the kind's module."""
    under = "" if kind == "embedding" else "encoder."
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        bare = key.removeprefix("model.")
        split = next(((m, parts) for p, parts in _SPLITS.items() if (m := p.match(bare))), None)
        if split is not None:
            match, parts = split
            for part, chunk in zip(parts, value.chunk(len(parts), dim=0)):
                out[f"{under}blocks.{match.group(1)}.{part}.{match.group(2)}"] = chunk.contiguous()
        elif (name := _rename(bare, _RENAMES)) is not None:
            out[under + name] = value
        elif _TIED.match(key):
            if not folder.config.get("tie_word_embeddings", True) and kind == "fill-mask":
                raise refuse(folder.where(), "tie_word_embeddings", False, [True])
        elif (name := _rename(key, _HEADS[kind])) is not None:
            out[name] = value
        elif not any(re.match(p, key) for heads in _HEADS.values() for p, _ in heads):
            raise ConversionError(f"{folder.path}: unexpected weight {key!r} for a {folder.architecture}")
    if kind == "fill-mask" and not folder.config.get("decoder_bias", True):
        out["head.bias"] = torch.zeros(int(folder.config["vocab_size"]))  # a decoder without bias
    return out


Model = ModernBertEncoder | ModernBertMaskedLM | ModernBertClassifier


def _model(folder: HFFolder, kind: str, options) -> tuple[Model, dict[str, Any]]:
    """(our module with the folder's weights, what was read for the manifest)."""
    if kind == "classification":
        names = classifier.labels(folder)
        head = HeadConfig(labels=names, activation=classifier.activation(folder, len(names)), token_types=False)
        limit = classifier.max_length(folder)
        cfg = read_config(folder, options, {"max_length": limit} if limit else {})
        read: dict[str, Any] = {
            "labels": names,
            "activation": head.activation,
            "classifier_pooling": cfg.classifier_pooling,
        }
        return ModernBertClassifier(cfg, head), read
    pipeline = bert.sentence_pipeline(folder) if kind == "embedding" else {}
    cfg = read_config(folder, options, pipeline)
    if kind == "fill-mask":
        return ModernBertMaskedLM(cfg), {}
    read = {"pooling": cfg.pooling, "normalizes": bool(pipeline.get("normalizes", False))}
    return ModernBertEncoder(cfg), {**read, "sentence_transformers": folder.modules is not None}


def load(folder: HFFolder, kind: str, options) -> Converted:
    model, read = _model(folder, kind, options)
    missing, unexpected = model.load_state_dict(map_weights(folder, folder.state_dict(), kind), strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"{folder.path}: weights do not fit a {folder.architecture} of this config "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    tokenizer, hf_tok = fast_tokenizer(folder)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    cfg = model.config
    source = {
        "architecture": folder.architecture,
        "model_type": "modernbert",
        "layer_types": cfg.layer_types,
        "local_attention": cfg.local_window,
        **read,
    }
    return Converted(
        kind=kind,
        model=model.eval(),
        tokenizer=tokenizer,
        special_tokens=bert._special_tokens(hf_tok, kind),
        max_input_tokens=cfg.max_length,
        source=source,
    )
