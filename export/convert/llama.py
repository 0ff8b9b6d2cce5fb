"""Llama, Mistral, Qwen2 and Qwen3 folders -> `GPTDecoder` (export/models/decoder.py) in its Llama form,
kind generation; as sentence-transformers embedders, kind embedding (export/convert/decoder_embedder.py).

The four share one block (transformers' modeling_llama.py, modeling_mistral.py, modeling_qwen2.py,
modeling_qwen3.py): RMSNorm, rotary positions (non-interleaved halves), grouped-query attention, a
SwiGLU MLP and an output head tied or not. They differ in plain config fields (`FAMILIES`): biases
(Llama's and Qwen3's `attention_bias`, Llama's `mlp_bias`, Qwen2's q, k, v), Qwen3's RMSNorm over each
head's query and key before rotary (with `head_dim` from the config, which may differ from
hidden / heads), and a sliding window (Mistral; Qwen2 and Qwen3 with `use_sliding_window`), which
equals full causal attention within W tokens, so the context is capped to W
(export/convert/causal_lm.py) and the graph needs no window mask. Rotary scaling comes from
`rope_parameters` or `rope_scaling` + `rope_theta` and must be in `decoder.ROPE_TYPES`;
`partial_rotary_factor` below 1 and activations outside `export.models.layers.ACTIVATIONS` are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from export.convert import causal_lm
from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder, fast_tokenizer
from export.models.decoder import ROPE_TYPES, DecoderConfig
from export.models.layers import ACTIVATIONS


@dataclass(frozen=True)
class Family:
    qkv_bias: bool | str  # a fixed value, or the config field holding it
    out_bias: bool | str
    mlp_bias: bool | str
    max_positions: int  # transformers' default max_position_embeddings
    window_default: int | None  # transformers' default sliding_window
    window_switch: bool | str  # whether sliding_window applies: always, never, or as this field says
    qk_norm: bool = False  # an RMSNorm over each head's query and key (Qwen3)


FAMILIES = {  # architectures[0] -> Family
    "LlamaForCausalLM": Family("attention_bias", "attention_bias", "mlp_bias", 2048, None, False),
    "MistralForCausalLM": Family(False, False, False, 131072, 4096, True),
    "Qwen2ForCausalLM": Family(True, False, False, 32768, 4096, "use_sliding_window"),
    "Qwen3ForCausalLM": Family("attention_bias", "attention_bias", False, 32768, 4096, "use_sliding_window", True),
}
BASE_MODELS = {  # the body without the LM head (what embedders save) -> its family's architecture
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
}
RENAMES = [  # (transformers name, export/models/decoder.py name)
    (r"^model\.embed_tokens\.", "wte."),
    (r"^model\.norm\.", "ln_f."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"blocks.\1.ln_attn."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"blocks.\1.ln_ffn."),
    (r"^model\.layers\.(\d+)\.self_attn\.q_proj\.", r"blocks.\1.attn.query."),
    (r"^model\.layers\.(\d+)\.self_attn\.k_proj\.", r"blocks.\1.attn.key."),
    (r"^model\.layers\.(\d+)\.self_attn\.v_proj\.", r"blocks.\1.attn.value."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", r"blocks.\1.attn.out."),
    (r"^model\.layers\.(\d+)\.self_attn\.(q_norm|k_norm)\.", r"blocks.\1.attn.\2."),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", r"blocks.\1.ffn.gate."),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", r"blocks.\1.ffn.fc_in."),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", r"blocks.\1.ffn.fc_out."),
    (r"^lm_head\.", "lm_head."),
]
UNUSED = r"\.rotary_emb\.inv_freq$"  # older checkpoints saved the frequencies; ours are recomputed


def rope(folder: HFFolder) -> tuple[float, dict | None]:
    """-> (rope_theta, DecoderConfig.rope_scaling): None for plain rotary, else {"rope_type", its parameters}."""
    hf, where = folder.config, folder.where()
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    params = dict(hf.get(field) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise refuse(where, f"{field}.rope_type", rope_type, list(ROPE_TYPES))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise refuse(where, "partial_rotary_factor", partial, [1.0])
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if rope_type == "llama3":
        params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    needed = ROPE_TYPES[rope_type][0]
    missing = [name for name in needed if params.get(name) is None]
    if missing:
        raise ConversionError(f"{where}: {field} of rope_type {rope_type!r} lacks {', '.join(missing)}")
    return theta, ({"rope_type": rope_type, **{name: params[name] for name in needed}} if needed else None)


def _flag(hf: dict, value: bool | str) -> bool:
    return bool(hf.get(value, False)) if isinstance(value, str) else value


def family(folder: HFFolder) -> Family:
    arch = folder.architecture
    return FAMILIES[BASE_MODELS.get(arch, arch)]


def window(folder: HFFolder) -> int | None:
    """The sliding window, when it is on (Qwen2 also says so per layer, in layer_types)."""
    hf = folder.config
    on = _flag(hf, family(folder).window_switch) or "sliding_attention" in (hf.get("layer_types") or [])
    size = hf.get("sliding_window", family(folder).window_default)
    return int(size) if on and size else None


def position_limit(folder: HFFolder) -> tuple[int, str]:
    """-> (the most positions the model takes, the config field that says so): a sliding window caps it."""
    limit = int(folder.config.get("max_position_embeddings", family(folder).max_positions))
    size = window(folder)
    if size is not None and size < limit:
        return size, "sliding_window"
    return limit, "max_position_embeddings"


def config_fields(folder: HFFolder, special: dict) -> dict:
    """DecoderConfig's fields from config.json, all but max_positions and tied_head."""
    hf, where, fam = folder.config, folder.where(), family(folder)
    activation = hf.get("hidden_act", "silu")
    if activation not in ACTIVATIONS:
        raise refuse(where, "hidden_act", activation, list(ACTIVATIONS))
    theta, scaling = rope(folder)
    d_model, n_heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    return dict(
        vocab_size=int(hf["vocab_size"]),
        d_model=d_model,
        n_layers=int(hf["num_hidden_layers"]),
        n_heads=n_heads,
        d_ff=int(hf["intermediate_size"]),
        layer_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        bos_token_id=special.get("bos", special["eos"]),
        eos_token_id=special["eos"],
        pad_token_id=special["pad"],
        norm="rmsnorm",
        activation=activation,
        gated_mlp=True,
        mlp_bias=_flag(hf, fam.mlp_bias),
        qkv_bias=_flag(hf, fam.qkv_bias),
        out_bias=_flag(hf, fam.out_bias),
        n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
        head_dim=int(hf.get("head_dim") or d_model // n_heads),
        qk_norm=fam.qk_norm,
        positions="rotary",
        rope_theta=theta,
        rope_scaling=scaling,
    )


def read_config(folder: HFFolder, options, special: dict) -> tuple[DecoderConfig, tuple[int, int, int]]:
    """DecoderConfig from config.json, and the served (context, max input, max output)."""
    lengths = causal_lm.served_lengths(folder, *position_limit(folder), options)
    tied = bool(folder.config.get("tie_word_embeddings", False))
    return DecoderConfig(**config_fields(folder, special), max_positions=lengths[0], tied_head=tied), lengths


def load(folder: HFFolder, kind: str, options) -> Converted:
    """The folder as a GPTDecoder (kind generation), or as a DecoderEmbedder (kind embedding)."""
    if kind == "embedding":
        from export.convert import decoder_embedder  # it reads configs through this module

        return decoder_embedder.load(folder, options)
    causal_lm.refuse_quantized(folder)
    tokenizer, hf_tokenizer = fast_tokenizer(folder)
    special = causal_lm.special_tokens(folder, hf_tokenizer, int(folder.config["vocab_size"]))
    cfg, lengths = read_config(folder, options, special)
    state = folder.state_dict()
    if cfg.tied_head:
        state.pop("lm_head.weight", None)  # the embedding, when saved twice
    model = causal_lm.decoder(folder, cfg, causal_lm.renamed(folder, state, RENAMES, UNUSED))
    return causal_lm.converted(
        folder,
        model,
        tokenizer,
        special,
        lengths,
        kv_heads=cfg.kv_heads,
        tied_head=cfg.tied_head,
        sliding_window=window(folder),
        rope_type=(cfg.rope_scaling or {}).get("rope_type", "default"),
    )
