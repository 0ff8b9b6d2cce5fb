"""Llama, Mistral, Qwen2 and Qwen3 sentence-transformers folders -> `DecoderEmbedder`, kind embedding.

The Qwen3-Embedding shape: modules.json with Transformer + Pooling (`pooling_mode_lasttoken`) +
Normalize, config_sentence_transformers.json with instruction `prompts` (export/convert/prompts.py),
weights saved from the body (`Qwen3Model`: no `model.` prefix, no LM head) or from the causal LM
(its `lm_head` dropped). The config is read as for generation (export/convert/llama.py), the
weights mapped onto the same `GPTDecoder` names; Pooling modes other than the last token are
refused naming the file. The input length is sentence_bert_config.json's max_seq_length (or
--max-input-tokens, else the model's positions), also the rotary table's rows.

The tokenizer ships as the folder has it: Qwen3-Embedding's post-processor appends <|endoftext|>,
which is the token pooled, exactly what sentence-transformers feeds its model.
"""

from __future__ import annotations

from export.convert import causal_lm, llama
from export.convert.bert import sentence_pipeline
from export.convert.errors import ConversionError, Converted, refuse
from export.convert.folder import HFFolder, fast_tokenizer
from export.models.decoder_embedder import DecoderEmbedder, DecoderEmbedderConfig

POOLING_MODES = {"pooling_mode_lasttoken": "last"}  # sentence-transformers' Pooling key -> ours


def read_config(folder: HFFolder, options, special: dict, pipeline: dict) -> DecoderEmbedderConfig:
    limit, limit_field = llama.position_limit(folder)
    max_length = options.max_input_tokens or pipeline.get("max_length") or limit
    if max_length > limit:
        raise ConversionError(
            f"{folder.where()}: max input tokens {max_length} exceed "
            f"the {limit} positions the model takes ({limit_field})"
        )
    if options.pooling not in (None, "last"):
        raise refuse(folder.where(), "--pooling", options.pooling, ["last"])
    return DecoderEmbedderConfig(
        **llama.config_fields(folder, special), max_positions=max_length, max_length=max_length, tied_head=True
    )


def body_weights(folder: HFFolder) -> dict:
    """The state dict under the causal LM's names (`model.` prefixed), without the LM head."""
    state = folder.state_dict()
    return {
        key if key.startswith("model.") else f"model.{key}": value
        for key, value in state.items()
        if not key.startswith("lm_head.")
    }


def load(folder: HFFolder, options) -> Converted:
    causal_lm.refuse_quantized(folder)
    pipeline = sentence_pipeline(folder, POOLING_MODES)
    tokenizer, hf_tokenizer = fast_tokenizer(folder)
    special = causal_lm.special_tokens(folder, hf_tokenizer, int(folder.config["vocab_size"]))
    cfg = read_config(folder, options, special, pipeline)
    model = DecoderEmbedder(cfg)
    state = causal_lm.renamed(folder, body_weights(folder), llama.RENAMES, llama.UNUSED)
    missing, unexpected = model.decoder.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"{folder.path}: weights do not fit a {folder.architecture} of this config "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return Converted(
        kind="embedding",
        model=model.eval(),
        tokenizer=tokenizer,
        special_tokens=special,
        max_input_tokens=cfg.max_length,
        source={
            "architecture": folder.architecture,
            "model_type": folder.config.get("model_type"),
            "pooling": cfg.pooling,
            "normalizes": bool(pipeline.get("normalizes", False)),
            "sentence_transformers": folder.modules is not None,
            "kv_heads": cfg.kv_heads,
            "rope_type": (cfg.rope_scaling or {}).get("rope_type", "default"),
        },
    )
