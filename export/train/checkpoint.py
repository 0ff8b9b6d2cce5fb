"""Trained checkpoints: the shipped form of the generator and the translator.

A checkpoint directory holds
- `config.json`: {"name", "kind": "generation"|"translation"|"fill-mask",
  "architecture": "gpt-decoder"|"seq2seq"|"bert-mlm",
  "config": the model's dataclass fields, "special_tokens": {...}, "max_length": int, "training": {...}};
- `model.safetensors`: the state dict (fp16 storage is allowed; weights load back as fp32);
- `tokenizer.json`: the `tokenizers` library's file;
- `README.md`: the model card.
`build_checkpoint` (`python -m export checkpoint`) turns one into a model directory through the parity gate.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from export.build import build_model_dir
from export.models.decoder import DecoderConfig, GPTDecoder
from export.models.encoder import EncoderConfig
from export.models.mlm import MaskedLM
from export.models.seq2seq import Seq2SeqConfig, Translator
from export.train.heldout import fill_mask_texts, heldout_sample
from service.manifest import ModelDir

Checkpointed = GPTDecoder | Translator | MaskedLM  # the models a checkpoint holds
ARCHITECTURES: dict[str, tuple[type[Checkpointed], type, str]] = {
    "gpt-decoder": (GPTDecoder, DecoderConfig, "generation"),
    "seq2seq": (Translator, Seq2SeqConfig, "translation"),
    "bert-mlm": (MaskedLM, EncoderConfig, "fill-mask"),
}


def architecture_of(model: torch.nn.Module) -> str:
    for arch, (cls, _, _) in ARCHITECTURES.items():
        if isinstance(model, cls):
            return arch
    raise TypeError(f"no checkpoint architecture for {type(model).__name__}")


def save_checkpoint(
    model,
    out_dir,
    *,
    name: str,
    tokenizer_path,
    special_tokens: dict,
    max_length: int,
    training: dict | None = None,
    fp16: bool = True,
) -> Path:
    """Write config.json, model.safetensors and tokenizer.json into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arch = architecture_of(model)
    state = {k: (v.half() if fp16 and v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    config = {
        "name": name,
        "kind": ARCHITECTURES[arch][2],
        "architecture": arch,
        "config": asdict(model.config),
        "special_tokens": special_tokens,
        "max_length": max_length,
        "training": training or {},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    src = Path(tokenizer_path)
    if src.resolve() != (out / "tokenizer.json").resolve():
        (out / "tokenizer.json").write_bytes(src.read_bytes())
    return out


def load_checkpoint(path) -> tuple[Checkpointed, dict]:
    """-> (model in eval mode with fp32 weights, the config.json dict). The tokenizer is path/tokenizer.json."""
    path = Path(path)
    meta = json.loads((path / "config.json").read_text())
    cls, cfg_cls, _ = ARCHITECTURES[meta["architecture"]]
    known = {f.name for f in fields(cfg_cls)}
    model = cls(cfg_cls(**{k: v for k, v in meta["config"].items() if k in known}))
    state = {
        k: v.float() if v.is_floating_point() else v for k, v in load_file(str(path / "model.safetensors")).items()
    }
    model.load_state_dict(state)
    return model.eval(), meta


def save_training_state(path, *, model, optimizer, scheduler_state: dict, step: int, extra: dict) -> None:
    """Everything a resumed run needs to continue exactly: weights (fp32), AdamW moments, the
    schedule, the step, the data cursor and the RNG states. Written atomically (tmp + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": scheduler_state,
        "step": step,
        "extra": extra,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_training_state(path, *, model, optimizer) -> dict:
    """Restore weights, optimizer and RNG states in place; returns the saved dict (step, schedule, extra)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state


def build_checkpoint(path: Path, out: Path, variants=(), extra: dict | None = None, device: str = "cpu") -> ModelDir:
    """A trained checkpoint directory (export/train/checkpoint.py) -> a model directory, through the gate.

    Lengths: a generator's context (max_length) is split in two, max_input_tokens + max_output_tokens
    = max_length, so a request can never run past the learned positions; a translator takes sources
    up to its training max_length and writes up to twice that (within its positions); a fill-mask
    model takes inputs up to its training max_length.
    """
    model, meta = load_checkpoint(path)
    tok = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    special = {k: int(v) for k, v in meta["special_tokens"].items()}
    info = {"checkpoint": meta["name"], "training": meta.get("training", {}), **(extra or {})}
    length, kind = int(meta["max_length"]), meta["kind"]
    limits = {  # kind -> (max_input_tokens, max_output_tokens)
        "fill-mask": (length, None),
        "generation": (length // 2, length - length // 2),
        "translation": (length, min(model.config.max_positions, 2 * length)),
    }
    if kind == "fill-mask":
        sample = fill_mask_texts(Path(path))
    else:
        sample = heldout_sample(meta, model.config, tok, Path(path)) if variants else None
    return build_model_dir(
        kind,
        model,
        tok,
        out,
        name=meta["name"],
        special_tokens=special,
        max_input_tokens=limits[kind][0],
        max_output_tokens=limits[kind][1],
        variants=variants,
        extra=info,
        quality_sample=sample,
        device=device,
    )
