"""BERT, RoBERTa and XLM-R `*ForSequenceClassification` folders (and sentence-transformers CrossEncoder
folders of them) -> `SequenceClassifier` (kind "classification": rerank and classify).

The encoder converts as bert.py converts it (same config fields, same weight names); the head is
the source's: BERT's `bert.pooler.dense` + tanh on [CLS] then `classifier`, RoBERTa's and XLM-R's
`classifier.dense` + tanh + `classifier.out_proj` on `<s>` (one computation: export/models/classifier.py).
Labels come from config.json's `id2label` (num_labels of them). The activation the service applies
is the folder's: a CrossEncoder's `activation_fn` (config_sentence_transformers.json, else
config.json's `sentence_transformers.activation_fn` or the older `sbert_ce_default_activation_function`),
else `problem_type`, else one label: sigmoid (TEI's and CrossEncoder's default), several: softmax.
The graph takes token_type_ids when the folder's tokenizer returns them (a BERT folder, even one
whose tokenizer_config names only `BertTokenizer` and a vocab.txt). A pair past the limit is cut
longest-first (CrossEncoder's default), or only in its second text where the folder says
`only_second` (`truncation`), which the manifest's extra.truncation tells the service. A
CrossEncoder pipeline with a module other than its Transformer is refused, naming it.
"""

from __future__ import annotations

import re

import torch

from export.convert import bert
from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder, fast_tokenizer
from export.models.classifier import TRUNCATIONS, HeadConfig, SequenceClassifier

# CrossEncoder activation_fn -> ours
ST_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "none",
    "torch.nn.modules.activation.Softmax": "softmax",
}
PROBLEM_TYPES = {"regression": None, "single_label_classification": None, "multi_label_classification": "sigmoid"}
TOKENIZER_STRATEGIES = {"LongestFirst": "longest_first", "OnlySecond": "only_second", "OnlyFirst": "only_first"}
CE_MODULES = ("sentence_transformers.models.Transformer", "sentence_transformers.base.modules.transformer.Transformer")
_HEADS = [  # (HF name after the model prefix is removed, ours)
    (r"^bert\.pooler\.dense\.", "head.dense."),
    (r"^classifier\.dense\.", "head.dense."),
    (r"^classifier\.out_proj\.", "head.out."),
    (r"^classifier\.", "head.out."),  # BERT's classifier, after RoBERTa's names
]


def labels(folder: HFFolder) -> list[str]:
    """id2label in id order; refused when it does not cover num_labels ids 0..n-1."""
    hf, where = folder.config, folder.where()
    id2label = {int(k): str(v) for k, v in (hf.get("id2label") or {}).items()}
    count = int(hf.get("num_labels") or len(id2label) or 2)
    if sorted(id2label) != list(range(count)):
        raise refuse(where, "id2label", hf.get("id2label"), [f"ids 0..{count - 1}"])
    return [id2label[i] for i in range(count)]


def activation(folder: HFFolder, count: int) -> str:
    """The activation the folder implies (module docstring), as one of export.models.classifier.ACTIVATIONS."""
    hf = folder.config
    st = folder.json("config_sentence_transformers.json") or {}
    for where, name in (
        ("config_sentence_transformers.json", st.get("activation_fn")),
        ("config.json", (hf.get("sentence_transformers") or {}).get("activation_fn")),
        ("config.json", hf.get("sbert_ce_default_activation_function")),
    ):
        if name:
            if name not in ST_ACTIVATIONS:
                raise refuse(folder.where(where), "activation_fn", name, list(ST_ACTIVATIONS))
            return ST_ACTIVATIONS[name]
    problem = hf.get("problem_type")
    if problem is not None and problem not in PROBLEM_TYPES:
        raise refuse(folder.where(), "problem_type", problem, list(PROBLEM_TYPES))
    chosen = PROBLEM_TYPES[problem] if problem is not None else None
    return chosen or ("sigmoid" if count == 1 else "softmax")


def max_length(folder: HFFolder) -> int | None:
    """A CrossEncoder's max_seq_length (sentence_bert_config.json), refusing pipeline modules we lack."""
    for module in folder.modules or []:
        if module.get("type") not in CE_MODULES:
            raise refuse(folder.where("modules.json"), "type", module.get("type"), CE_MODULES)
    st = folder.json("sentence_bert_config.json") or {}
    return int(st["max_seq_length"]) if st.get("max_seq_length") else None


def truncation(folder: HFFolder) -> str:
    """How the folder cuts a pair past the limit: sentence_bert_config.json's processing_kwargs (text, else
    common) `truncation` (CrossEncoder's), else tokenizer.json's truncation strategy, else longest_first."""
    kwargs = (folder.json("sentence_bert_config.json") or {}).get("processing_kwargs") or {}
    said = [("sentence_bert_config.json", (kwargs.get(k) or {}).get("truncation")) for k in ("text", "common")]
    strategy = ((folder.json("tokenizer.json") or {}).get("truncation") or {}).get("strategy")
    if isinstance(strategy, str):
        said.append(("tokenizer.json", TOKENIZER_STRATEGIES.get(strategy, strategy)))
    for where, value in said:
        if value is not None:
            value = "longest_first" if value is True else value
            if value not in TRUNCATIONS:
                raise refuse(folder.where(where), "truncation", value, TRUNCATIONS)
            return value
    return "longest_first"


def map_weights(folder: HFFolder, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Head weights by _HEADS; the rest through bert.map_weights (the encoder's names)."""
    head, rest = {}, {}
    for key, value in state.items():
        for pattern, replacement in _HEADS:
            new, n = re.subn(pattern, replacement, key)
            if n:
                head[new] = value
                break
        else:
            rest[key] = value
    encoder = bert.map_weights(folder, rest, head=False)
    return {**{f"encoder.{k}": v for k, v in encoder.items()}, **head}


def load(folder: HFFolder, kind: str, options) -> Converted:
    names = labels(folder)
    head_cfg = HeadConfig(labels=names, activation=activation(folder, len(names)), truncation=truncation(folder))
    limit = max_length(folder)
    cfg = bert.read_config(folder, options, {"max_length": limit} if limit else {})
    tokenizer, hf_tok = fast_tokenizer(folder)
    head_cfg.token_types = "token_type_ids" in hf_tok.model_input_names
    if head_cfg.token_types and cfg.type_vocab_size < 2:
        raise refuse(folder.where(), "type_vocab_size", cfg.type_vocab_size, [">= 2 (its tokenizer gives pair types)"])
    model = SequenceClassifier(cfg, head_cfg)
    missing, unexpected = model.load_state_dict(map_weights(folder, folder.state_dict()), strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"{folder.path}: weights do not fit a {folder.architecture} of this config "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    tokenizer.no_padding()
    tokenizer.no_truncation()
    source = {
        "architecture": folder.architecture,
        "model_type": folder.config["model_type"],
        "labels": names,
        "activation": head_cfg.activation,
        "truncation": head_cfg.truncation,
        "cross_encoder": folder.modules is not None or folder.json("config_sentence_transformers.json") is not None,
    }
    return Converted(
        kind=kind,
        model=model.eval(),
        tokenizer=tokenizer,
        special_tokens=bert._special_tokens(hf_tok, kind),
        max_input_tokens=cfg.max_length,
        source=source,
    )
