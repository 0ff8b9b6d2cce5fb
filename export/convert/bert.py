"""BERT, RoBERTa, XLM-R and DistilBERT folders -> `SentenceEncoder` (embedding) or `MaskedLM` (fill-mask).

All share BERT's post-LN encoder and weight names under a prefix (`bert.`, `roberta.`), and
differ in plain config fields: positions (RoBERTa and XLM-R count from padding_idx + 1), one token
type, and the masked-LM head's names (`cls.predictions.*` or `lm_head.*`, both dense -> activation
-> LayerNorm -> the tied embedding + bias). DistilBERT is the same block under other names
(`transformer.layer.N.attention.q_lin`, `sa_layer_norm`, `ffn.lin1`, ...; config `dim`, `n_layers`,
...; head `vocab_transform`, `vocab_layer_norm`, `vocab_projector`) without token types. A
sentence-transformers folder (modules.json) adds pooling (mean, CLS or max), max_seq_length and
whether it normalises; any other module (Dense) is refused. all-MiniLM-L6-v2
(export/convert/minilm.py) comes through here.
"""

from __future__ import annotations

import re
from typing import TypeVar

import torch

from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder, fast_tokenizer
from export.models.encoder import EncoderConfig, SentenceEncoder
from export.models.layers import ACTIVATIONS
from export.models.mlm import MaskedLM

M = TypeVar("M", MaskedLM, SentenceEncoder)
# model_type -> weight prefix
MODEL_TYPES = {"bert": "bert.", "roberta": "roberta.", "xlm-roberta": "roberta.", "distilbert": "distilbert."}
OFFSET_POSITIONS = ("roberta", "xlm-roberta")  # positions counted from padding_idx + 1
DISTILBERT_FIELDS = {  # DistilBERT's config.json names -> BERT's
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size",
    "activation": "hidden_act",
}
POSITION_TYPES = ("absolute",)
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
ST_MODULES = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
)
_ENCODER_RENAMES = [  # (HF name after the prefix, export/models/encoder.py name)
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.position_embeddings\.", "embeddings.position."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"blocks.\1.attn.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"blocks.\1.ln_attn."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"blocks.\1.ffn.fc_in."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"blocks.\1.ffn.fc_out."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"blocks.\1.ln_ffn."),
    # DistilBERT: the same post-LN block under other names
    (r"^transformer\.layer\.(\d+)\.attention\.q_lin\.", r"blocks.\1.attn.query."),
    (r"^transformer\.layer\.(\d+)\.attention\.k_lin\.", r"blocks.\1.attn.key."),
    (r"^transformer\.layer\.(\d+)\.attention\.v_lin\.", r"blocks.\1.attn.value."),
    (r"^transformer\.layer\.(\d+)\.attention\.out_lin\.", r"blocks.\1.attn.out."),
    (r"^transformer\.layer\.(\d+)\.sa_layer_norm\.", r"blocks.\1.ln_attn."),
    (r"^transformer\.layer\.(\d+)\.ffn\.lin1\.", r"blocks.\1.ffn.fc_in."),
    (r"^transformer\.layer\.(\d+)\.ffn\.lin2\.", r"blocks.\1.ffn.fc_out."),
    (r"^transformer\.layer\.(\d+)\.output_layer_norm\.", r"blocks.\1.ln_ffn."),
]
_HEAD_RENAMES = [  # (HF masked-LM head name, export/models/mlm.py name)
    (r"^(cls\.predictions\.transform|lm_head)\.dense\.", "head.dense."),
    (r"^vocab_transform\.", "head.dense."),
    (r"^(cls\.predictions\.transform\.LayerNorm|lm_head\.layer_norm|vocab_layer_norm)\.", "head.norm."),
    (r"^(cls\.predictions|lm_head|vocab_projector)\.bias$", "head.bias"),
]
_TIED = re.compile(r"^((cls\.predictions|lm_head)\.decoder\.(weight|bias)|vocab_projector\.weight)$")  # if saved
_UNUSED = re.compile(r"^(pooler\.|embeddings\.position_ids$|cls\.seq_relationship\.)")


def _rename(key: str, table) -> str | None:
    for pattern, replacement in table:
        new, n = re.subn(pattern, replacement, key)
        if n:
            return new
    return None


def sentence_pipeline(folder: HFFolder, modes: dict[str, str] = POOLING_MODES) -> dict:
    """modules.json's pipeline -> {"pooling", "max_length", "normalizes"} (keys absent when not said);
    `modes`: the Pooling config keys the model supports -> ours (a decoder embedder's: last token)."""
    out: dict = {}
    for module in folder.modules or []:
        kind = module.get("type", "")
        if kind not in ST_MODULES:
            raise refuse(folder.where("modules.json"), "type", kind, ST_MODULES)
        if kind.endswith(".Normalize"):
            out["normalizes"] = True
        elif kind.endswith(".Pooling"):
            where = f"{module.get('path', '')}/config.json"
            pooling = folder.json(where) or {}
            chosen = [mode for key, mode in modes.items() if pooling.get(key)]
            other = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v and k not in modes]
            if other or len(chosen) != 1:
                raise refuse(folder.where(where), "pooling mode", other or chosen, list(modes))
            if not pooling.get("include_prompt", True):  # pooling that skips the prompt's tokens (INSTRUCTOR)
                raise refuse(folder.where(where), "include_prompt", False, [True])
            out["pooling"] = chosen[0]
    st = folder.json("sentence_bert_config.json") or {}
    if st.get("max_seq_length"):
        out["max_length"] = int(st["max_seq_length"])
    return out


def bert_fields(folder: HFFolder) -> dict:
    """config.json in BERT's field names: DistilBERT's renamed (DISTILBERT_FIELDS), one token type."""
    hf = folder.config
    if hf.get("model_type") != "distilbert":
        return hf
    if hf.get("sinusoidal_pos_embds"):
        raise refuse(folder.where(), "sinusoidal_pos_embds", True, [False])
    return {**hf, **{ours: hf[k] for k, ours in DISTILBERT_FIELDS.items() if k in hf}, "type_vocab_size": 1}


def read_config(folder: HFFolder, options, pipeline: dict) -> EncoderConfig:
    """EncoderConfig from config.json (+ the sentence-transformers pipeline and the command line)."""
    hf, where = bert_fields(folder), folder.where()
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise refuse(where, "model_type", model_type, list(MODEL_TYPES))
    if hf.get("position_embedding_type", "absolute") not in POSITION_TYPES:
        raise refuse(where, "position_embedding_type", hf["position_embedding_type"], POSITION_TYPES)
    if hf.get("hidden_act", "gelu") not in ACTIVATIONS:
        raise refuse(where, "hidden_act", hf["hidden_act"], list(ACTIVATIONS))
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise refuse(where, "is_decoder", True, [False])
    pad = int(hf.get("pad_token_id") or 0)
    offset = pad + 1 if model_type in OFFSET_POSITIONS else 0
    usable = int(hf["max_position_embeddings"]) - offset
    max_length = options.max_input_tokens or pipeline.get("max_length") or usable
    if max_length > usable:
        raise ConversionError(f"{where}: max input tokens {max_length} exceed the model's {usable} positions")
    return EncoderConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        pooling=options.pooling or pipeline.get("pooling", "mean"),
        max_length=max_length,
        pad_token_id=pad,
        activation=hf.get("hidden_act", "gelu"),
        position_offset=offset,
    )


def map_weights(folder: HFFolder, state: dict[str, torch.Tensor], head: bool) -> dict[str, torch.Tensor]:
    """The folder's state dict renamed onto SentenceEncoder (head=False) or MaskedLM (head=True)."""
    prefix = MODEL_TYPES[folder.config["model_type"]]
    tied = folder.config.get("tie_word_embeddings", True)
    out = {}
    for key, value in state.items():
        bare = key.removeprefix(prefix)
        if _UNUSED.match(bare):
            continue
        if (name := _rename(bare, _ENCODER_RENAMES)) is not None:
            out[f"encoder.{name}" if head else name] = value
        elif (match := _TIED.match(bare)) is not None:
            if not tied and head and match.group(0).endswith("weight"):
                raise refuse(folder.where(), "tie_word_embeddings", False, [True])
        elif (name := _rename(bare, _HEAD_RENAMES)) is not None:
            if head:
                out[name] = value
        else:
            raise ConversionError(f"{folder.path}: unexpected weight {key!r} for a {folder.architecture}")
    if folder.config["model_type"] == "distilbert":  # no token types: our one type adds zeros
        out[f"{'encoder.' if head else ''}embeddings.token_type.weight"] = torch.zeros(1, folder.config["dim"])
    return out


def _special_tokens(tok, kind: str) -> dict[str, int]:
    names = {"cls": tok.cls_token_id, "sep": tok.sep_token_id, "pad": tok.pad_token_id, "unk": tok.unk_token_id}
    if kind == "fill-mask" or tok.mask_token_id is not None:
        names["mask"] = tok.mask_token_id
    missing = [k for k, v in names.items() if v is None]
    if missing:
        raise ConversionError(f"the tokenizer has no {', '.join(missing)} token")
    return {k: int(v) for k, v in names.items()}


def _loaded(folder: HFFolder, model: M) -> M:
    """model with the folder's weights (ConversionError when they do not fit it)."""
    head = isinstance(model, MaskedLM)
    state = map_weights(folder, folder.state_dict(), head)
    if head:
        state.update({k: torch.zeros_like(v) for k, v in model.state_dict().items() if k.startswith("sop.")})  # unused
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"{folder.path}: weights do not fit a {folder.architecture} of this config "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    return model


def masked_lm(folder: HFFolder, cfg: EncoderConfig) -> MaskedLM:
    """The folder's masked LM (encoder and MLM head) on our MaskedLM (also SPLADE's: splade.py)."""
    return _loaded(folder, MaskedLM(cfg))


def load(folder: HFFolder, kind: str, options) -> Converted:
    pipeline = sentence_pipeline(folder) if kind == "embedding" else {}
    cfg = read_config(folder, options, pipeline)
    model = masked_lm(folder, cfg) if kind == "fill-mask" else _loaded(folder, SentenceEncoder(cfg))
    tokenizer, hf_tok = fast_tokenizer(folder)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    source = {
        "architecture": folder.architecture,
        "model_type": folder.config["model_type"],
        "pooling": cfg.pooling,
        "normalizes": bool(pipeline.get("normalizes", False)),
        "sentence_transformers": folder.modules is not None,
    }
    return Converted(
        kind=kind,
        model=model.eval(),
        tokenizer=tokenizer,
        special_tokens=_special_tokens(hf_tok, kind),
        max_input_tokens=cfg.max_length,
        source=source,
    )
