"""Held-out texts of a trained checkpoint: the sample on which its reduced-precision variants are judged.

`write_heldout` stores them beside the weights (`heldout.jsonl`) from the training corpus, so every
build (a fresh clone, a container) judges on the same data; `heldout_sample` turns them into
token sequences for the generator's or translator's gate; `fill_mask_texts` into passages for a
fill-mask model's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tokenizers import Tokenizer

from export.modeldir import ROOT

log = logging.getLogger(__name__)

QUALITY_WINDOWS = 32  # generator: held-out windows of the full context (8,192 tokens at 256)
QUALITY_PAIRS = 512  # translator: held-out test pairs (English source, its French references)
HELDOUT_FILE = "heldout.jsonl"  # in a checkpoint directory: the held-out texts the gate judges on
FILL_MASK_TEXTS = 64  # fill-mask: held-out passages the reduced-precision variants are judged on


def heldout_texts(meta: dict, cfg, tok: Tokenizer) -> list[dict] | None:
    """The checkpoint's held-out texts from the training corpus (the split of training and `export
    evaluate`): whole stories ({"text"}) covering QUALITY_WINDOWS context windows, or the first
    QUALITY_PAIRS test items ({"source", "references"}). None when the corpus is not here."""
    from export.train import data

    training = meta.get("training", {})
    kind = "generator" if meta["kind"] == "generation" else "translator"
    recorded = Path(training.get("data", ""))  # relative to the directory training ran in (the repository)
    path = next(
        (p for p in (recorded, ROOT / recorded) if training.get("data") and p.is_file()), data.DEFAULT_DATA[kind]
    )
    if not path.is_file():
        return None
    seed, sizes = training.get("seed", 0), training.get("split", {})
    if kind == "translator":
        split = data.split_tatoeba(
            data.load_tatoeba(path), seed=seed, n_test=sizes.get("test", 2000), n_dev=sizes.get("dev", 1000)
        )
        return [{"source": en, "references": refs} for en, refs in split.test[:QUALITY_PAIRS]]
    _, held = data.split_stories(data.load_stories(path), seed=seed)
    need, tokens, out = QUALITY_WINDOWS * (cfg.max_positions + 1), 0, []
    for story, enc in zip(held, tok.encode_batch(held)):
        out.append({"text": story})
        tokens += len(enc.ids)  # the leading separator each story gets in the stream
        if tokens > need:
            break
    return out


def write_heldout(checkpoint: Path) -> Path | None:
    """Stores the checkpoint's held-out texts beside its weights, so that every build (a fresh
    clone, a container) judges reduced-precision variants on the same data. -> the file, or None."""
    from types import SimpleNamespace

    meta = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))  # no model built:
    cfg = SimpleNamespace(**meta["config"])  # training calls this mid-run and must not touch torch's RNG
    texts = heldout_texts(meta, cfg, Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json")))
    if texts is None:
        log.warning("%s: the training corpus is not here; no %s written", checkpoint, HELDOUT_FILE)
        return None
    out = Path(checkpoint) / HELDOUT_FILE
    out.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    log.info("wrote %d held-out items to %s", len(texts), out)
    return out


def heldout_sample(meta: dict, cfg, tok: Tokenizer, checkpoint: Path | None = None) -> tuple[str, list] | None:
    """Token sample for judging reduced-precision variants: from the checkpoint's heldout.jsonl when
    present, else from the training corpus; None (the gate texts are used) when neither is here."""
    file = Path(checkpoint) / HELDOUT_FILE if checkpoint else None
    if file is not None and file.is_file():
        texts = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        where = f"{file.parent.name}/{HELDOUT_FILE}"
    else:
        from_corpus = heldout_texts(meta, cfg, tok)
        if from_corpus is None:
            log.warning(
                "quality sample: no %s and no training corpus; reduced-precision variants are judged on the gate texts",
                HELDOUT_FILE,
            )
            return None
        texts, where = from_corpus, "the training corpus"
    if meta["kind"] == "generation":
        from export.train import data

        stream = data.story_stream([e.ids[1:] for e in tok.encode_batch([t["text"] for t in texts])], cfg.eos_token_id)
        width = cfg.max_positions + 1
        windows = [stream[i : i + width].tolist() for i in range(0, len(stream) - width, width)][:QUALITY_WINDOWS]
        return f"{len(windows)} windows of {width - 1} tokens of held-out stories ({where})", windows
    src = [e.ids[: cfg.max_positions] for e in tok.encode_batch([t["source"] for t in texts])]
    tgt = [
        [cfg.decoder_start_token_id, *e.ids][: cfg.max_positions + 1]
        for e in tok.encode_batch([t["references"][0] for t in texts])
    ]
    return f"{len(texts)} held-out test pairs, first reference ({where})", list(zip(src, tgt))


def fill_mask_texts(checkpoint: Path) -> tuple[str, list[str]] | None:
    """(description, texts): FILL_MASK_TEXTS passages of the checkpoint's heldout.jsonl, or None."""
    file = Path(checkpoint) / HELDOUT_FILE
    if not file.is_file():
        return None
    rows = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [r["text"] for r in rows[:: max(1, len(rows) // FILL_MASK_TEXTS)]][:FILL_MASK_TEXTS]
    return f"{len(texts)} held-out passages ({file.parent.name}/{HELDOUT_FILE})", texts
