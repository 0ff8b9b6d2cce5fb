"""A converted classifier against transformers on the same folder (reference.py's check for kind "classification").

Tokenizer: ids, and token type ids where transformers returns them, equal on single texts and on
pairs (query, document), untruncated and truncated as the folder cuts pairs (longest-first or
only_second: a pair transformers cannot cut so must be refused by ours) at the model's limit and at
a short one. Logits: `AutoModelForSequenceClassification` on the same pairs, right-padded, within
`LOGITS_MAX_ABS` at every label. A miss raises `parity.ParityError`.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from export.convert.errors import Converted
from export.convert.folder import HFFolder
from export.gate import parity

LOGITS_MAX_ABS = 1e-3  # as reference.py's
SHORT_LIMIT = 12  # a limit that cuts most pairs: truncation as transformers does it


def _pairs(texts: list[str]) -> list[tuple[str, str]]:
    return [(texts[i], texts[(i + 3) % len(texts)]) for i in range(len(texts))]


def _tokenizer_figures(reference, ours: Tokenizer, texts: list[str], limit: int, strategy: str) -> dict:
    checked, refused = 0, 0
    for cut in (None, limit, SHORT_LIMIT):
        for item in [*texts, *_pairs(texts)]:
            args = item if isinstance(item, tuple) else (item,)
            tok = Tokenizer.from_str(ours.to_str())
            tok.no_padding()  # a single text is cut at its end whatever the pair strategy (the service's)
            way = strategy if len(args) == 2 else "longest_first"
            tok.no_truncation() if cut is None else tok.enable_truncation(cut, strategy=way)
            try:
                want = reference(*args, truncation=way if cut is not None else False, max_length=cut)
            except Exception:  # only_second: a first text that leaves no room; ours must refuse it too
                _refuses(tok, args)
                refused += 1
                continue
            got = tok.encode(*args)
            same = want["input_ids"] == got.ids
            if "token_type_ids" in want:
                same = same and want["token_type_ids"] == got.type_ids
            if not same:
                raise parity.ParityError(
                    f"tokenizer: the model directory's tokenizer differs from the folder's on {item!r} "
                    f"(truncation {cut}): ids {got.ids} types {got.type_ids} vs {want['input_ids']} "
                    f"types {want.get('token_type_ids')}"
                )
            checked += 1
    return {
        "inputs": checked,
        "pairs": True,
        "refused_alike": refused,
        "same_ids": True,
        "same_type_ids": "token_type_ids" in want,
    }


def _refuses(tok: Tokenizer, args: tuple) -> None:
    try:
        tok.encode(*args)
    except Exception:
        return
    raise parity.ParityError(f"tokenizer: transformers cannot truncate {args!r} as the folder says, ours does")


def check(folder: HFFolder, c: Converted, texts: list[str]) -> dict:
    """-> figures; raises parity.ParityError on a miss."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)
    strategy = c.source.get("truncation", "longest_first")
    figures = {"tokenizer": _tokenizer_figures(reference, c.tokenizer, texts, c.max_input_tokens, strategy)}
    hf = AutoModelForSequenceClassification.from_pretrained(str(folder.path), local_files_only=True).eval()
    batch = reference(
        [a for a, _ in _pairs(texts)],
        [b for _, b in _pairs(texts)],
        truncation=True,  # the logits of the same ids (pairs of any length; how they are cut: above)
        max_length=c.max_input_tokens,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        ref = hf(**batch).logits
        got = c.model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    diff = float((ref - got).abs().max())
    if diff > LOGITS_MAX_ABS:
        parity._fail("classifier logits max abs diff vs transformers", diff, LOGITS_MAX_ABS)
    figures["classification"] = {"logits_max_abs_diff": diff, "pairs": len(texts), "labels": int(ref.shape[-1])}
    return figures
