"""Masked-language-model corpora: passages of three shared corpora, a held-out split, packed chunks.

Corpora (under `export.train.data.SHARED`; each folder's SOURCE.md gives origin and
licence): WikiText-2 raw validation (one passage per paragraph, `@-@` conventions undone),
TinyStories' first 2 MiB (one passage per story), TinyShakespeare (speeches grouped into passages
of >= 400 characters). A seeded 5 % of each corpus's passages is held out, never trained on (the
checkpoint's heldout.jsonl). Tokenized passages are packed in order into chunks of up to
max_len - 2 word pieces, each row `[CLS] chunk [SEP]`. Batches are drawn from (seed, step) only,
so a resumed run sees the batches the uninterrupted one would have.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np

FILES = {  # corpus name -> its file under the shared data folder (export.train.data.SHARED by default)
    "wikitext-2": "wikitext-2/wiki.valid.raw",
    "tinystories": "tinystories/TinyStories-train.first2MiB.txt",
    "tinyshakespeare": "tinyshakespeare/input.txt",
}
HOLDOUT = 0.05
_WIKI_JOINS = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}


def wikitext_passages(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("="):  # blank lines and `= Title =` / `= = Section = =` headings
            continue
        for raw, joined in _WIKI_JOINS.items():
            line = line.replace(raw, joined)
        out.append(line)
    return out


def story_passages(text: str) -> list[str]:
    parts = text.split("<|endoftext|>")
    return [s.strip() for s in parts[:-1] if s.strip()]  # the cut-off last story is dropped


def shakespeare_passages(text: str, min_chars: int = 400) -> list[str]:
    out, current = [], []
    for speech in re.split(r"\n\s*\n", text.strip()):
        current.append(speech.strip())
        if sum(len(s) for s in current) >= min_chars:
            out.append("\n\n".join(current))
            current = []
    if current:
        out.append("\n\n".join(current))
    return out


READERS = {"wikitext-2": wikitext_passages, "tinystories": story_passages, "tinyshakespeare": shakespeare_passages}


def load_passages(root: Path) -> dict[str, list[str]]:
    """corpus name -> its passages in file order; root: the shared data folder."""
    return {name: READERS[name]((Path(root) / file).read_text(encoding="utf-8")) for name, file in FILES.items()}


def split_passages(
    passages: dict[str, list[str]], seed: int = 0, holdout: float = HOLDOUT
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """-> (train, held-out), each corpus -> passages in file order; a seeded `holdout` share of
    every corpus's passages is held out."""
    train, held = {}, {}
    for name, items in passages.items():
        order = list(range(len(items)))
        random.Random(f"{seed}:{name}").shuffle(order)
        out = set(order[: max(1, round(len(items) * holdout))])
        train[name] = [p for i, p in enumerate(items) if i not in out]
        held[name] = [p for i, p in enumerate(items) if i in out]
    return train, held


def pack(token_lists: list[list[int]], width: int) -> list[list[int]]:
    """Consecutive passages packed greedily into chunks of <= width tokens; a passage longer than
    width is cut into width-sized pieces (the last piece starts a new chunk's packing)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    for ids in token_lists:
        for start in range(0, len(ids), width):
            piece = ids[start : start + width]
            if current and len(current) + len(piece) > width:
                chunks.append(current)
                current = []
            current = current + piece
    if current:
        chunks.append(current)
    return chunks


def batch_rows(n_chunks: int, rows: int, seed: int, step: int) -> np.ndarray:
    """The chunk indices of one step's batch: a function of (seed, step) only."""
    return np.random.default_rng([seed, step]).integers(0, n_chunks, size=rows)
