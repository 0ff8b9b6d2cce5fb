"""BERT, RoBERTa, XLM-R and DistilBERT masked-LM folders -> `SpladeEncoder` (kind "sparse-embedding": SPLADE).

A sentence-transformers SparseEncoder folder (modules.json: the masked LM, as `MLMTransformer` or a
`Transformer` whose sentence_bert_config.json says transformer_task "fill-mask", at the folder's
root, then `SpladePooling`, whose config.json gives pooling_strategy and activation_function)
converts by default; a plain `*ForMaskedLM` folder converts with `--kind sparse-embedding` and
SpladePooling's defaults (max, relu). max_seq_length comes from sentence_bert_config.json, else the
model's positions. The encoder and its MLM head map as bert.py maps a masked LM. Other modules
(SparseAutoEncoder, Router for inference-free SPLADE, SparseStaticEmbedding) are refused, naming them.
"""

from __future__ import annotations

from export.convert import bert
from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder, fast_tokenizer
from export.models.mlm import SPLADE_ACTIVATIONS, SPLADE_POOLINGS, SpladeConfig, SpladeEncoder

MLM_MODULES = (
    "sentence_transformers.sparse_encoder.models.MLMTransformer",
    "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer",
    "sentence_transformers.base.modules.transformer.Transformer",
    "sentence_transformers.models.Transformer",
)
POOLING_MODULES = (
    "sentence_transformers.sparse_encoder.models.SpladePooling",
    "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
)
ST_CONFIG = "sentence_bert_config.json"


def is_sparse(folder: HFFolder) -> bool:
    """Whether the folder is a SparseEncoder with SPLADE pooling (its default kind is then sparse-embedding)."""
    return any(m.get("type") in POOLING_MODULES for m in folder.modules or [])


def _pooling(folder: HFFolder, path: str) -> SpladeConfig:
    where = f"{path}/config.json" if path else "config.json"
    config = folder.json(where) or {}
    pooling = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if pooling not in SPLADE_POOLINGS:
        raise refuse(folder.where(where), "pooling_strategy", pooling, SPLADE_POOLINGS)
    if activation not in SPLADE_ACTIVATIONS:
        raise refuse(folder.where(where), "activation_function", activation, SPLADE_ACTIVATIONS)
    return SpladeConfig(pooling, activation)


def pipeline(folder: HFFolder) -> tuple[SpladeConfig, int | None]:
    """(the pooling, max_seq_length or None) of the folder's sentence-transformers pipeline, if any."""
    splade, modules = SpladeConfig(), folder.modules or []
    for module in modules:
        kind, path = module.get("type", ""), module.get("path", "")
        if kind in POOLING_MODULES:
            splade = _pooling(folder, path)
        elif kind not in MLM_MODULES:
            raise refuse(folder.where("modules.json"), "type", kind, MLM_MODULES + POOLING_MODULES)
        elif path:  # the weights this converter reads are the folder's own
            raise refuse(folder.where("modules.json"), f"{kind.rsplit('.', 1)[-1]} path", path, [""])
    if modules and not is_sparse(folder):
        raise ConversionError(f"{folder.where('modules.json')}: no SpladePooling module (a sparse embedder needs one)")
    st = folder.json(ST_CONFIG) or {}
    task = st.get("transformer_task", "fill-mask")
    if task != "fill-mask":
        raise refuse(folder.where(ST_CONFIG), "transformer_task", task, ["fill-mask"])
    return splade, int(st["max_seq_length"]) if st.get("max_seq_length") else None


def load(folder: HFFolder, kind: str, options) -> Converted:
    splade, limit = pipeline(folder)
    cfg = bert.read_config(folder, options, {"max_length": limit} if limit else {})
    model = SpladeEncoder(cfg, splade)
    model.mlm.load_state_dict(bert.masked_lm(folder, cfg).state_dict())
    tokenizer, hf_tok = fast_tokenizer(folder)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    source = {
        "architecture": folder.architecture,
        "model_type": folder.config["model_type"],
        "splade_pooling": splade.pooling,
        "splade_activation": splade.activation,
        "sentence_transformers": folder.modules is not None,
    }
    return Converted(
        kind=kind,
        model=model.eval(),
        tokenizer=tokenizer,
        special_tokens=bert._special_tokens(hf_tok, kind),
        max_input_tokens=cfg.max_length,
        source=source,
    )
