"""Training corpora: loading, deterministic held-out splits, and batching by token count.

- Tatoeba English-French (manythings.org "fra-eng": `English<TAB>French` per line, xz-compressed):
  split into train / dev / test GROUPED BY ENGLISH SENTENCE, so every French translation of one
  English sentence sits on one side and test sentences never leak into training. The test and
  dev sides keep all references of each English sentence (multi-reference BLEU).
- TinyStories: stories separated by `<|endoftext|>` lines; a seeded ~5 % of whole stories is held
  out for perplexity. The cut-off story after the last separator is dropped.

Batches are built from seeds and an epoch / step number only, so a resumed run sees exactly the
batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import lzma
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


def _shared_data() -> Path:
    """The shared corpora: `shared/data` inside the checkout where it has one (a copy of the
    working tree on a device machine), else beside it, `../shared/data`, where the development
    and CI machines keep them."""
    root = Path(__file__).resolve().parents[2]
    inside = root / "shared" / "data"
    return inside if inside.is_dir() else root.parent / "shared" / "data"


SHARED = _shared_data()
DEFAULT_DATA = {
    "generator": SHARED / "tinystories" / "TinyStories-train.first2MiB.txt",
    "translator": SHARED / "tatoeba-eng-fra" / "fra.txt.xz",
    "mlm": SHARED,  # the folder of the three corpora export/train/mlm_data.py reads
}
STORY_SEPARATOR = "<|endoftext|>"


@dataclass
class TatoebaSplit:
    train: list[tuple[str, str]]  # one (en, fr) row per pair
    dev: list[tuple[str, list[str]]]  # (en, all its French references)
    test: list[tuple[str, list[str]]]


def load_tatoeba(path: Path) -> list[tuple[str, str]]:
    """(en, fr) pairs in file order; accepts the .xz file or plain text."""
    path = Path(path)
    opener = lzma.open if path.suffix == ".xz" else open
    pairs = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 2:
                raise ValueError(f"{path}:{n}: expected 'English<TAB>French', got {line[:80]!r}")
            pairs.append((fields[0], fields[1]))
    return pairs


def split_tatoeba(pairs: list[tuple[str, str]], seed: int = 0, n_test: int = 2000, n_dev: int = 1000) -> TatoebaSplit:
    """Shuffle the distinct English sentences with `seed`; the first n_test go to test, the next
    n_dev to dev, the rest to train, each with every one of its French translations."""
    refs: dict[str, list[str]] = {}
    for en, fr in pairs:
        refs.setdefault(en, []).append(fr)
    english = sorted(refs)
    random.Random(seed).shuffle(english)
    if n_test + n_dev >= len(english):
        raise ValueError(f"n_test + n_dev = {n_test + n_dev} leaves no training data ({len(english)} sentences)")
    test = [(en, refs[en]) for en in english[:n_test]]
    dev = [(en, refs[en]) for en in english[n_test : n_test + n_dev]]
    train = [(en, fr) for en in english[n_test + n_dev :] for fr in refs[en]]
    return TatoebaSplit(train=train, dev=dev, test=test)


def load_stories(path: Path) -> list[str]:
    """Whole stories (text between separator lines), stripped; the unterminated tail is dropped."""
    text = Path(path).read_text(encoding="utf-8")
    parts = text.split(STORY_SEPARATOR)
    return [s.strip() for s in parts[:-1] if s.strip()]


def split_stories(stories: list[str], seed: int = 0, holdout: float = 0.05) -> tuple[list[str], list[str]]:
    """-> (train, held-out) with a seeded `holdout` fraction of whole stories held out."""
    order = list(range(len(stories)))
    random.Random(seed).shuffle(order)
    n_held = max(1, round(len(stories) * holdout))
    held = set(order[:n_held])
    return [s for i, s in enumerate(stories) if i not in held], [s for i, s in enumerate(stories) if i in held]


def story_stream(token_lists: list[list[int]], separator_id: int) -> np.ndarray:
    """Stories concatenated, each preceded by the separator: the stream the generator learns."""
    out: list[int] = []
    for ids in token_lists:
        out.append(separator_id)
        out.extend(ids)
    out.append(separator_id)
    return np.asarray(out, dtype=np.int64)


def stream_batch(
    stream: np.ndarray, batch_size: int, context: int, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the stream for one step: inputs and next-token targets, each (B, context)."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - context - 1, size=batch_size)
    rows = np.stack([stream[s : s + context + 1] for s in starts])  # (B, context + 1)
    t = torch.from_numpy(rows)
    return t[:, :-1], t[:, 1:]


def stream_windows(stream: np.ndarray, context: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping windows covering the whole stream (perplexity), each (1, <=context)."""
    out = []
    for s in range(0, len(stream) - 1, context):
        chunk = torch.from_numpy(stream[s : s + context + 1])[None, :]  # (1, n + 1)
        out.append((chunk[:, :-1], chunk[:, 1:]))
    return out


def token_batches(lengths: list[int], max_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped into batches of similar length whose padded size (rows x longest) stays
    within max_tokens; lengths are sorted with a seeded jitter and the batch order is shuffled."""
    rng = random.Random(seed * 100_003 + epoch)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest row -> (ids (B, T), mask (B, T) 1 = real token)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def translation_batch(src: list[list[int]], tgt: list[list[int]], pad_id: int, bos_id: int, eos_id: int) -> dict:
    """Source ids already end in </s>; the target is fed as <s> y and predicted as y </s>."""
    src_ids, src_mask = pad(src, pad_id)
    tgt_in, tgt_mask = pad([[bos_id, *t] for t in tgt], pad_id)
    labels, _ = pad([[*t, eos_id] for t in tgt], -100)  # -100: ignored by the loss
    return {"src_ids": src_ids, "src_mask": src_mask, "tgt_ids": tgt_in, "tgt_mask": tgt_mask, "labels": labels}
