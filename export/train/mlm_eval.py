"""Held-out evaluation of a masked language model, against two baselines.

The held-out passages (a checkpoint's heldout.jsonl) are encoded one per row as
`[CLS] passage [SEP]`; 15 % of each row's word pieces are chosen with a fixed seed
(export/train/masking.py) and all replaced by `[MASK]`, as a fill-mask request writes them. At those
positions: the model's top-1 accuracy and perplexity, and the same for a unigram-frequency
baseline (add-one smoothed) and for `NeighbourLookup`, which predicts the training split's most
frequent piece between the two neighbours (backing off to the left neighbour, then the unigram
top): how much the model does beyond counting local n-grams. The lookup needs the training text
(`python -m export evaluate mlm CKPT` reads the shared corpora when present).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from export.train import data
from export.train.masking import IGNORE, mask_all_chosen

EVAL_SEED = 1234
UNIGRAM_FILE = "unigram.json"  # in a checkpoint directory: training-split token counts


def unigram_counts(token_lists, vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in token_lists:
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
    return counts


def unigram_log_probs(counts: np.ndarray, n_special: int) -> np.ndarray:
    """Add-one smoothed log-probabilities over ids >= n_special (specials get -inf)."""
    smoothed = counts.astype(np.float64) + 1.0
    smoothed[:n_special] = 0.0
    with np.errstate(divide="ignore"):
        return np.log(smoothed / smoothed.sum())


class NeighbourLookup:
    """The neighbour baseline (module doc), counted once from the training split's token lists."""

    def __init__(self, train_ids):
        from collections import Counter, defaultdict

        between: dict[tuple[int, int], Counter] = defaultdict(Counter)
        after: dict[int, Counter] = defaultdict(Counter)
        for ids in train_ids:
            for i in range(1, len(ids)):
                after[ids[i - 1]][ids[i]] += 1
                if i + 1 < len(ids):
                    between[ids[i - 1], ids[i + 1]][ids[i]] += 1
        self.between = {k: c.most_common(1)[0][0] for k, c in between.items()}
        self.after = {k: c.most_common(1)[0][0] for k, c in after.items()}

    def accuracy(self, rows: dict, unigram_best: int) -> float:
        """Top-1 accuracy at rows' chosen positions (labels != IGNORE)."""
        inputs, labels = rows["input_ids"].tolist(), rows["labels"].tolist()
        correct = n = 0
        for row, targets in zip(inputs, labels):
            for t, target in enumerate(targets):
                if target == IGNORE:
                    continue
                left, right = row[t - 1], row[t + 1] if t + 1 < len(row) else None
                correct += self.between.get((left, right), self.after.get(left, unigram_best)) == target
                n += 1
        return round(correct / max(n, 1), 4)


def save_unigram(counts: np.ndarray, out: Path) -> None:
    (Path(out) / UNIGRAM_FILE).write_text(json.dumps({"counts": counts.tolist()}) + "\n", encoding="utf-8")


def load_unigram(checkpoint: Path) -> np.ndarray:
    return np.asarray(json.loads((Path(checkpoint) / UNIGRAM_FILE).read_text(encoding="utf-8"))["counts"])


def masked_rows(tok: Tokenizer, texts: list[str], max_len: int, special: dict, seed: int = EVAL_SEED) -> dict:
    """-> {"input_ids", "attention_mask", "labels"} (B, T): the fixed evaluation masking."""
    tok.no_padding()
    rows = [[*e.ids[: max_len - 1], special["sep"]] if len(e.ids) > max_len else e.ids for e in tok.encode_batch(texts)]
    ids, mask = data.pad(rows, special["pad"])
    is_special = (ids == special["cls"]) | (ids == special["sep"]) | (mask == 0)
    inputs, labels = mask_all_chosen(ids, is_special, mask_id=special["mask"], gen=torch.Generator().manual_seed(seed))
    return {"input_ids": inputs, "attention_mask": mask, "labels": labels}


@torch.no_grad()
def evaluate(model, rows: dict, log_unigram: np.ndarray, batch_size: int = 32) -> dict:
    """Masked-token accuracy and perplexity of the model and of the unigram baseline (module doc)."""
    model.eval()
    device = next(model.parameters()).device
    nll, correct, n = 0.0, 0, 0
    targets = []
    for start in range(0, len(rows["input_ids"]), batch_size):
        part = {k: v[start : start + batch_size].to(device) for k, v in rows.items()}
        chosen = part["labels"] != IGNORE
        if not chosen.any():
            continue
        logits = model(part["input_ids"], part["attention_mask"])[chosen].float()  # (N, V)
        target = part["labels"][chosen]
        nll += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(-1) == target).sum())
        n += int(target.numel())
        targets.append(target.cpu().numpy())
    target = np.concatenate(targets)
    best = int(np.argmax(log_unigram))
    return {
        "masked_accuracy": round(correct / n, 4),
        "masked_perplexity": round(math.exp(nll / n), 2),
        "unigram_accuracy": round(float((target == best).mean()), 4),
        "unigram_perplexity": round(float(np.exp(-log_unigram[target].mean())), 2),
        "masked_positions": n,
    }


def checkpoint_figures(
    checkpoint: Path, model, meta: dict, tok: Tokenizer, every: int = 1, neighbours: NeighbourLookup | None = None
) -> dict:
    """Held-out figures of a checkpoint (its heldout.jsonl and unigram.json), overall and per corpus,
    on every `every`-th passage; with neighbours, the neighbour baseline's accuracy too."""
    lines = (Path(checkpoint) / "heldout.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()][::every]
    log_unigram = unigram_log_probs(load_unigram(checkpoint), n_special=len(meta["special_tokens"]))
    special, length = meta["special_tokens"], meta["max_length"]
    result: dict[str, dict] = {}
    for corpus in ["all", *sorted({r["corpus"] for r in rows})]:
        masked = masked_rows(tok, [r["text"] for r in rows if corpus in ("all", r["corpus"])], length, special)
        result[corpus] = evaluate(model, masked, log_unigram)
        if neighbours is not None:
            result[corpus]["neighbour_accuracy"] = neighbours.accuracy(masked, int(np.argmax(log_unigram)))
    return {**result, "passages": len(rows)}


@torch.no_grad()
def fill(model, tok: Tokenizer, text: str, top_k: int = 5) -> list[list[tuple[str | None, float]]]:
    """PyTorch reference fill-mask: per [MASK] in text, the top_k (token, probability), best first."""
    enc = tok.encode(text)
    ids = torch.tensor([enc.ids])
    probs = torch.softmax(model.eval()(ids, torch.ones_like(ids))[0], dim=-1)  # (T, V)
    mask_id = tok.token_to_id("[MASK]")
    if mask_id is None:
        raise ValueError("the tokenizer has no [MASK] token")
    out = []
    for pos in torch.eq(ids[0], mask_id).nonzero().flatten().tolist():
        p, i = probs[pos].topk(top_k)
        out.append([(tok.id_to_token(int(t)), round(float(q), 3)) for q, t in zip(p, i)])
    return out
