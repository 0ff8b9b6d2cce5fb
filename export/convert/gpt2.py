"""GPT-2 folders (GPT2LMHeadModel) -> `GPTDecoder` (export/models/decoder.py), kind generation.

GPT-2 is the block the decoder was written from (pre-LN, learned positions, tied head, gelu_new);
what differs is storage: `Conv1D` keeps weights as (in, out), the transpose of a Linear's, and one
`c_attn` projects query, key and value together (split here), as minGPT's `from_pretrained` does.
Names may carry a `transformer.` prefix. Refused, naming the field: attention options our attention
does not compute (`scale_attn_weights` false, `scale_attn_by_inverse_layer_idx`,
`reorder_and_upcast_attn`, `add_cross_attention`) and activations outside
`export.models.layers.ACTIVATIONS`. The context is n_positions capped as export/convert/causal_lm.py says.
"""

from __future__ import annotations

import re

import torch

from export.convert import causal_lm
from export.convert.errors import Converted, refuse
from export.convert.folder import HFFolder, fast_tokenizer
from export.models.decoder import DecoderConfig
from export.models.layers import ACTIVATIONS

# config field -> the one value converted (its transformers default)
ATTENTION_FIELDS = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
}
_CONV1D = re.compile(r"\.(c_attn|c_proj|c_fc)\.weight$")
_RENAMES = [  # (GPT-2 name, without transformer. and with c_attn split, export/models/decoder.py name)
    (r"^(wte|wpe|ln_f)\.", r"\1."),
    (r"^h\.(\d+)\.ln_1\.", r"blocks.\1.ln_attn."),
    (r"^h\.(\d+)\.attn\.(query|key|value)\.", r"blocks.\1.attn.\2."),
    (r"^h\.(\d+)\.attn\.c_proj\.", r"blocks.\1.attn.out."),
    (r"^h\.(\d+)\.ln_2\.", r"blocks.\1.ln_ffn."),
    (r"^h\.(\d+)\.mlp\.c_fc\.", r"blocks.\1.ffn.fc_in."),
    (r"^h\.(\d+)\.mlp\.c_proj\.", r"blocks.\1.ffn.fc_out."),
    (r"^lm_head\.", "lm_head."),
]
_UNUSED = r"^h\.\d+\.attn\.(bias|masked_bias)$"  # the causal mask buffers of older checkpoints


def read_config(folder: HFFolder, options, vocab_tokens: dict) -> tuple[DecoderConfig, tuple[int, int, int]]:
    """DecoderConfig from config.json, and the served (context, max input, max output)."""
    hf, where = folder.config, folder.where()
    for name, value in ATTENTION_FIELDS.items():
        if hf.get(name, value) != value:
            raise refuse(where, name, hf[name], [value])
    activation = hf.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise refuse(where, "activation_function", activation, list(ACTIVATIONS))
    lengths = causal_lm.served_lengths(folder, int(hf.get("n_positions", 1024)), "n_positions", options)
    d_model = int(hf["n_embd"])
    cfg = DecoderConfig(
        vocab_size=int(hf["vocab_size"]),
        d_model=d_model,
        n_layers=int(hf["n_layer"]),
        n_heads=int(hf["n_head"]),
        d_ff=int(hf.get("n_inner") or 4 * d_model),
        max_positions=lengths[0],
        layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        activation=activation,
        bos_token_id=vocab_tokens.get("bos", vocab_tokens["eos"]),
        eos_token_id=vocab_tokens["eos"],
        pad_token_id=vocab_tokens["pad"],
        tied_head=bool(hf.get("tie_word_embeddings", True)),
    )
    return cfg, lengths


def linear_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Conv1D weights (in, out) -> Linear's (out, in); c_attn (3C rows once transposed) -> query,
    key, value; the `transformer.` prefix dropped."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("transformer.")
        if _CONV1D.search(key):
            value = value.T  # (out, in)
        if ".attn.c_attn." in key:
            for part, chunk in zip(("query", "key", "value"), value.chunk(3)):  # (C, C) / (C,) each
                out[key.replace("c_attn", part)] = chunk
        else:
            out[key] = value
    return out


def load(folder: HFFolder, kind: str, options) -> Converted:
    """The folder as a GPTDecoder (kind: generation, the only one ARCHITECTURES gives GPT-2)."""
    causal_lm.refuse_quantized(folder)
    tokenizer, hf_tokenizer = fast_tokenizer(folder)
    special = causal_lm.special_tokens(folder, hf_tokenizer, int(folder.config["vocab_size"]))
    cfg, lengths = read_config(folder, options, special)
    state = linear_layout(folder.state_dict())
    if cfg.tied_head:
        state.pop("lm_head.weight", None)  # the embedding, when saved twice
    state = causal_lm.renamed(folder, state, _RENAMES, _UNUSED)
    if "wpe.weight" in state:
        state["wpe.weight"] = state["wpe.weight"][: cfg.max_positions]  # (context, C): the positions served
    model = causal_lm.decoder(folder, cfg, state)
    return causal_lm.converted(
        folder, model, tokenizer, special, lengths, activation=cfg.activation, tied_head=cfg.tied_head
    )
