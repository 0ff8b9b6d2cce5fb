"""Marian / OPUS-MT folders (MarianMTModel) -> `Translator` (export/models/seq2seq.py), kind translation.

The model as transformers' modeling_marian.py computes it: post-LN layers, no final norms,
`activation_function` (OPUS-MT: SiLU), embeddings scaled by sqrt(d_model) when `scale_embedding`,
sinusoids with the sines in the first half, one embedding for source, target and the tied head,
`final_logits_bias`, decoding from `decoder_start_token_id`. Weights map by name (`_RENAMES`).
Single-token `bad_words_ids` go into the logits bias as `BANNED_LOGIT` (finite, for fp32 parity);
`forced_eos_token_id`, `num_beams` and `max_length` are left to the request; any other generation
setting that changes the output is refused (`NEUTRAL`), as are separate vocabularies, an untied
head that differs, the BART-era fields Marian ignores (`FIXED_FIELDS`) and mismatched encoder /
decoder shapes, naming the file and field (docs/models.md). The tokenizer: marian_tokenizer.py.
"""

from __future__ import annotations

import re

import torch

from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder
from export.convert.marian_tokenizer import marian_tokenizer
from export.convert.reference import hf_tokenizer
from export.models.layers import ACTIVATIONS, POSITION_LAYOUTS
from export.models.seq2seq import Seq2SeqConfig, Translator

BANNED_LOGIT = -100.0
# config.json field -> the one value converted (the value transformers computes with, also when absent)
FIXED_FIELDS = {
    "share_encoder_decoder_embeddings": True,
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "add_bias_logits": False,
    "static_position_embeddings": True,
}
# encoder field, decoder field: our Translator has one of each
SYMMETRIC = [("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")]
# generation setting -> its neutral value (unset or this: converted; the service does not apply them)
NEUTRAL = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "sequence_bias": None,
}
EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
POSITIONS = re.compile(r"^model\.(encoder|decoder)\.embed_positions\.weight$")
_RENAMES = [  # (transformers name, export/models/seq2seq.py name)
    (r"^model\.encoder\.layers\.(\d+)\.self_attn\.", r"encoder_layers.\1.attn."),
    (r"^model\.encoder\.layers\.(\d+)\.self_attn_layer_norm\.", r"encoder_layers.\1.ln_attn."),
    (r"^model\.encoder\.layers\.(\d+)\.", r"encoder_layers.\1."),
    (r"^model\.decoder\.layers\.(\d+)\.self_attn_layer_norm\.", r"decoder_layers.\1.ln_self."),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn\.", r"decoder_layers.\1.cross_attn."),
    (r"^model\.decoder\.layers\.(\d+)\.encoder_attn_layer_norm\.", r"decoder_layers.\1.ln_cross."),
    (r"^model\.decoder\.layers\.(\d+)\.", r"decoder_layers.\1."),
]
_PARTS = [
    (r"\.q_proj\.", ".query."),
    (r"\.k_proj\.", ".key."),
    (r"\.v_proj\.", ".value."),
    (r"\.out_proj\.", ".out."),
    (r"\.fc1\.", ".ffn.fc_in."),
    (r"\.fc2\.", ".ffn.fc_out."),
    (r"\.final_layer_norm\.", ".ln_ffn."),
]  # (within a layer, ours)
REQUIRED = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "pad_token_id",
)


def _rename(key: str) -> str | None:
    for pattern, replacement in _RENAMES:
        name, n = re.subn(pattern, replacement, key)
        if n:
            break
    else:
        return None
    for pattern, replacement in _PARTS:
        name = re.sub(pattern, replacement, name)
    return name


def generation_settings(folder: HFFolder) -> tuple[dict, str]:
    """generation_config.json (else the generation fields of config.json) and its file name."""
    gen = folder.json("generation_config.json")
    return (gen, "generation_config.json") if gen is not None else (folder.config, "config.json")


def _check_fields(folder: HFFolder, gen: dict, gen_file: str) -> None:
    hf, where = folder.config, folder.where()
    missing = [name for name in REQUIRED if name not in hf]
    if missing:
        raise ConversionError(f"{where}: no {', '.join(missing)}")
    for name, value in FIXED_FIELDS.items():
        if name in hf and hf[name] != value:
            raise refuse(where, name, hf[name], [value])
    if (folder.json("tokenizer_config.json") or {}).get("separate_vocabs"):  # a target_vocab.json for the decoder
        raise refuse(folder.where("tokenizer_config.json"), "separate_vocabs", True, [False])
    for enc, dec in SYMMETRIC:
        if hf.get(enc) != hf.get(dec):
            raise ConversionError(f"{where}: {enc} = {hf.get(enc)} and {dec} = {hf.get(dec)} differ (supported: equal)")
    activation = hf.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise refuse(where, "activation_function", activation, list(ACTIVATIONS))
    for name, neutral in NEUTRAL.items():
        if gen.get(name) not in (None, neutral):
            raise refuse(folder.where(gen_file), name, gen[name], [neutral])


def banned_tokens(folder: HFFolder, gen: dict, gen_file: str) -> list[int]:
    """Single-token bad_words_ids (token ids banned from every output)."""
    words = gen.get("bad_words_ids") or []
    if any(len(w) != 1 for w in words):
        raise refuse(folder.where(gen_file), "bad_words_ids", words, ["single-token entries"])
    return [w[0] for w in words]


def read_config(folder: HFFolder, gen: dict, options) -> Seq2SeqConfig:
    """Seq2SeqConfig from config.json (absent fields: MarianConfig's defaults) and the generation settings."""
    hf = folder.config
    pad, eos = int(hf["pad_token_id"]), hf.get("eos_token_id", 0)
    if not isinstance(eos, int):
        raise refuse(folder.where(), "eos_token_id", eos, ["one id"])
    start = int(gen.get("decoder_start_token_id", hf.get("decoder_start_token_id", pad)))
    positions = int(hf.get("max_position_embeddings", 1024))
    for name, value, limit in (
        ("max_input_tokens", options.max_input_tokens, positions),
        ("max_output_tokens", options.max_output_tokens, positions - 1),
    ):
        if value is not None and not 1 <= value <= limit:
            raise ConversionError(
                f"{folder.where()}: {name} {value} is outside 1 .. {limit} (max_position_embeddings {positions})"
            )
    return Seq2SeqConfig(
        vocab_size=int(hf["vocab_size"]),
        d_model=int(hf["d_model"]),
        n_encoder_layers=int(hf["encoder_layers"]),
        n_decoder_layers=int(hf["decoder_layers"]),
        n_heads=int(hf["encoder_attention_heads"]),
        d_ff=int(hf["encoder_ffn_dim"]),
        max_positions=positions,
        dropout=0.0,
        pad_token_id=pad,
        bos_token_id=start,
        eos_token_id=eos,
        norm_position="post",
        final_norms=False,
        activation=hf.get("activation_function", "gelu"),
        positions="marian",
        scale_embedding=bool(hf.get("scale_embedding", False)),
        final_logits_bias=True,
        decoder_start_token_id=start,
    )


def _embedding(folder: HFFolder, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The one shared embedding (V, C); every saved copy of it, and an untied head, must equal it."""
    copies = [k for k in (*EMBEDDINGS, "lm_head.weight") if k in state]
    if not copies or copies[0] == "lm_head.weight":
        raise ConversionError(f"{folder.path}: no embedding weights ({' or '.join(EMBEDDINGS)})")
    weight = state[copies[0]]
    for key in copies[1:]:
        if not torch.equal(state[key], weight):
            field = "tie_word_embeddings" if key == "lm_head.weight" else "share_encoder_decoder_embeddings"
            raise ConversionError(
                f"{folder.path}: {key} differs from {copies[0]}: an untied head or separate "
                f"embeddings ({field}) are not supported"
            )
    if not folder.config.get("tie_word_embeddings", True) and "lm_head.weight" not in state:
        raise refuse(folder.where(), "tie_word_embeddings", False, [True])
    return weight


def mapped_state(folder: HFFolder, cfg: Seq2SeqConfig, banned: list[int]) -> dict[str, torch.Tensor]:
    """The folder's weights under our names; position tables checked against ours and dropped."""
    state = folder.state_dict()
    out = {"embed.weight": _embedding(folder, state)}
    bias = state.get("final_logits_bias", torch.zeros(1, cfg.vocab_size)).reshape(-1).clone()  # (V,)
    bias[banned] = BANNED_LOGIT
    out["final_logits_bias"] = bias
    ours = POSITION_LAYOUTS[cfg.positions](cfg.max_positions, cfg.d_model)
    for key, value in state.items():
        if key in (*EMBEDDINGS, "lm_head.weight", "final_logits_bias"):
            continue
        if POSITIONS.match(key):
            if value.shape != ours.shape or float((value - ours).abs().max()) > 1e-5:
                raise ConversionError(
                    f"{folder.path}: {key} is not the sinusoidal table transformers computes "
                    "(learned positions are not supported)"
                )
            continue
        name = _rename(key)
        if name is None:
            raise ConversionError(f"{folder.path}: unexpected weight {key!r} for a {folder.architecture}")
        out[name] = value
    return out


def load(folder: HFFolder, kind: str, options) -> Converted:
    """The folder as a Translator with its tokenizer (kind: always translation, ARCHITECTURES)."""
    gen, gen_file = generation_settings(folder)
    _check_fields(folder, gen, gen_file)
    cfg = read_config(folder, gen, options)
    banned = banned_tokens(folder, gen, gen_file)
    reference_tokenizer = hf_tokenizer(folder)
    tokenizer, tokenizer_figures = marian_tokenizer(folder, reference_tokenizer)
    if tokenizer.get_vocab_size() != cfg.vocab_size:
        raise ConversionError(
            f"{folder.where()}: vocab_size {cfg.vocab_size} but vocab.json holds {tokenizer.get_vocab_size()} pieces"
        )
    if reference_tokenizer.eos_token_id != cfg.eos_token_id:
        raise ConversionError(
            f"{folder.where()}: eos_token_id {cfg.eos_token_id} is not the tokenizer's "
            f"{reference_tokenizer.eos_token!r} ({reference_tokenizer.eos_token_id})"
        )
    model = Translator(cfg)
    missing, unexpected = model.load_state_dict(mapped_state(folder, cfg, banned), strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"{folder.path}: weights do not fit a {folder.architecture} of this config "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    special = {
        "pad": cfg.pad_token_id,
        "eos": cfg.eos_token_id,
        "unk": reference_tokenizer.unk_token_id,
        "decoder_start": cfg.decoder_start_token_id,
    }
    return Converted(
        kind="translation",
        model=model.eval(),
        tokenizer=tokenizer,
        special_tokens=special,
        max_input_tokens=options.max_input_tokens or cfg.max_positions,
        max_output_tokens=options.max_output_tokens or cfg.max_positions - 1,
        source={
            "architecture": folder.architecture,
            "model_type": folder.config.get("model_type"),
            "activation": cfg.activation,
            "banned_tokens": banned,
            "tokenizer": tokenizer_figures,
        },
    )
