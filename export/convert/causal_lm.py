"""What the decoder converters (gpt2.py, llama.py) share: the served context, special tokens, weights
renamed onto `GPTDecoder`, and the `Converted` they return.

The model directory's `max_positions` is the service's context (KV slots per row, rotary table
rows), and a real checkpoint's positions would make a KV buffer far too large. So the context is
max_input_tokens + max_output_tokens, from Options or, when not given, half of DEFAULT_CONTEXT each
(bounded by the checkpoint's `limit`, itself capped by a sliding window); lengths over the limit
are refused naming its field, and the context is at least MIN_CONTEXT where the limit allows (the
parity gate generates parity.GREEDY_NEW_TOKENS after its prompts).
"""

from __future__ import annotations

import re

import torch

from export.convert.errors import ConversionError, Converted
from export.convert.folder import HFFolder
from export.models.decoder import DecoderConfig, GPTDecoder

DEFAULT_CONTEXT = 2048
MIN_CONTEXT = 128
REFUSED_FIELDS = ("quantization_config",)  # weights stored in forms our fp32 modules do not take


def refuse_quantized(folder: HFFolder) -> None:
    for name in REFUSED_FIELDS:
        if folder.config.get(name):
            raise ConversionError(
                f"{folder.where()}: {name} is set (a quantized checkpoint); convert the unquantized weights"
            )


def served_lengths(folder: HFFolder, limit: int, limit_field: str, options) -> tuple[int, int, int]:
    """-> (context, max_input_tokens, max_output_tokens) as the module doc says."""
    half = min(DEFAULT_CONTEXT, limit) // 2
    given_in, given_out = options.max_input_tokens, options.max_output_tokens
    max_in = given_in if given_in is not None else min(half, limit - (given_out or 0))
    max_out = given_out if given_out is not None else min(half, limit - max_in)
    if max_in + max_out > limit:
        raise ConversionError(
            f"{folder.where()}: max_input_tokens + max_output_tokens = {max_in + max_out} exceed "
            f"the {limit} positions the model takes ({limit_field})"
        )
    if max_in < 1 or max_out < 1:
        raise ConversionError(
            f"{folder.where()}: max_input_tokens {max_in} and max_output_tokens {max_out} must "
            f"both be at least 1 within the {limit} positions the model takes ({limit_field})"
        )
    return min(limit, max(max_in + max_out, MIN_CONTEXT)), max_in, max_out


def _token_id(value) -> int | None:
    """A config / tokenizer token id; a list (Llama 3's several end tokens) -> its first (end_tokens keeps all)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else int(value)


def special_tokens(folder: HFFolder, hf_tokenizer, vocab_size: int) -> dict[str, int]:
    """{"bos" (when the model has one), "eos", "pad"}: config.json's ids, else the tokenizer's; pad
    falls back to eos (the service pads batches with it; padded slots are never attended)."""
    cfg = folder.config
    ids = {}
    for name in ("bos", "eos", "pad"):
        ids[name] = _token_id(cfg.get(f"{name}_token_id"))
        if ids[name] is None:
            ids[name] = _token_id(getattr(hf_tokenizer, f"{name}_token_id", None))
    if ids["eos"] is None:
        raise ConversionError(
            f"{folder.where()}: no eos_token_id (nor an eos token in the tokenizer); "
            "generation could only stop at its length limit"
        )
    if ids["pad"] is None:
        ids["pad"] = ids["eos"]
    out = {name: i for name, i in ids.items() if i is not None}
    wrong = {name: i for name, i in out.items() if not 0 <= i < vocab_size}
    if wrong:
        raise ConversionError(f"{folder.where()}: token ids {wrong} are outside the vocabulary of {vocab_size}")
    return out


def _id_list(value) -> list[int]:
    return [int(i) for i in (value if isinstance(value, list) else [value]) if i is not None]


def end_tokens(folder: HFFolder, eos: int, vocab_size: int) -> list[int]:
    """Every id generation stops at, `eos` (the primary) first: generation_config.json's
    eos_token_id where it gives one (transformers' `generate` reads it there), else config.json's;
    Llama 3 lists several (<|end_of_text|>, <|eom_id|>, <|eot_id|>)."""
    gen = folder.json("generation_config.json")
    listed = _id_list(gen.get("eos_token_id")) if isinstance(gen, dict) else []
    where = "generation_config.json" if listed else "config.json"
    listed = listed or _id_list(folder.config.get("eos_token_id"))
    wrong = [i for i in listed if not 0 <= i < vocab_size]
    if wrong:
        raise ConversionError(f"{folder.where(where)}: eos_token_id {wrong} outside the vocabulary of {vocab_size}")
    return list(dict.fromkeys([eos, *listed]))


def renamed(
    folder: HFFolder, state: dict[str, torch.Tensor], table: list[tuple[str, str]], unused: str
) -> dict[str, torch.Tensor]:
    """The state dict renamed by a table of (regular expression, replacement); names matching
    `unused` are dropped; any other name is refused (a weight we would silently lose)."""
    out = {}
    for key, value in state.items():
        for pattern, replacement in table:
            name, n = re.subn(pattern, replacement, key)
            if n:
                out[name] = value
                break
        else:
            if not re.search(unused, key):
                raise ConversionError(f"{folder.path}: unexpected weight {key!r} for a {folder.architecture}")
    return out


def decoder(folder: HFFolder, cfg: DecoderConfig, state: dict[str, torch.Tensor]) -> GPTDecoder:
    """GPTDecoder(cfg) holding exactly the given weights (ours by name), in eval mode."""
    model = GPTDecoder(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"{folder.path}: weights do not fit a {folder.architecture} of this config "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    return model.eval()


def converted(
    folder: HFFolder, model: GPTDecoder, tokenizer, special: dict[str, int], lengths: tuple[int, int, int], **source
) -> Converted:
    context, max_in, max_out = lengths  # served_lengths()
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return Converted(
        kind="generation",
        model=model,
        tokenizer=tokenizer,
        special_tokens=special,
        eos_token_ids=end_tokens(folder, special["eos"], model.config.vocab_size),
        max_input_tokens=max_in,
        max_output_tokens=max_out,
        source={
            "architecture": folder.architecture,
            "model_type": folder.config.get("model_type"),
            "context": context,
            **source,
        },
    )
