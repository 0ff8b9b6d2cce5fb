"""The converted model against transformers' own forward and tokenizer, on the same folder.

transformers is the reference here, an export dependency only (the model directory never names
it). At conversion: the tokenizer's ids equal the folder's AutoTokenizer's on `TEXTS`; embeddings
reach cosine >= parity.ENCODER_MIN_COS against transformers' pooled hidden states (a decoder
embedder's: the last real token's); logits at every
real position are within `LOGITS_MAX_ABS` (fill-mask, generation, translation teacher-forced), and
so are SPLADE weights (transformers' logits pooled as SpladePooling does);
greedy tokens equal `generate(do_sample=False)` for GREEDY_TOKENS new tokens (generation,
translation with num_beams=1), and where ours emits one of the end ids (`Converted.eos_token_ids`),
`generate` given that list stops at the same token. A miss raises `parity.ParityError`; the figures
go into the manifest (`extra.converted_from.reference`).
"""

from __future__ import annotations

import logging
from typing import TypeVar

import torch

from export.convert.errors import Converted
from export.convert.folder import HFFolder
from export.gate import parity
from export.models.decoder import GPTDecoder
from export.models.decoder_embedder import DecoderEmbedder, last_token
from export.models.families import Encoder
from export.models.mlm import SpladeEncoder
from export.models.seq2seq import Translator

log = logging.getLogger(__name__)
M = TypeVar("M", bound=torch.nn.Module)

GREEDY_TOKENS = 24
LOGITS_MAX_ABS = 1e-3  # fp32 on real-size checkpoints: sums over thousands of products, two code paths
TEXTS = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "Überraschung! Ça coûte 12,50 € — naïve café, Straße, 東京, Привет.",
    "I'm not sure that's right; could you check again?",
    "Once upon a time, there was a little girl who loved to read books about dragons and castles.",
    "  leading spaces, tabs\tand\nnew lines  ",
    "emoji 🙂👍🏽 and accents: résumé, coöperate, São Paulo",
    "def f(x):\n    return x ** 2  # code",
]


def hf_tokenizer(folder: HFFolder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True)


def _tokenizer_figures(folder: HFFolder, converted: Converted) -> dict:
    reference = hf_tokenizer(folder)
    texts = TEXTS
    mismatched = [t for t in texts if reference(t)["input_ids"] != converted.tokenizer.encode(t).ids]
    if mismatched:
        raise parity.ParityError(
            f"tokenizer: the model directory's tokenizer gives other ids than the folder's on "
            f"{len(mismatched)} of {len(texts)} texts, first {mismatched[0]!r}: "
            f"{converted.tokenizer.encode(mismatched[0]).ids} vs "
            f"{reference(mismatched[0])['input_ids']}"
        )
    return {"texts": len(texts), "same_ids": True}


def _batch(tokenizer, texts, limit: int, pad_id: int):
    seqs = [tokenizer.encode(t).ids[:limit] for t in texts]
    ids, mask = parity.pad_batch(seqs, pad_id, left=False)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def _pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        return last_token(hidden, mask)
    weights = mask.to(hidden.dtype)[:, :, None]  # (B, T, 1)
    if pooling == "max":
        return hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def _ours(c: Converted, cls: type[M]) -> M:
    """c.model, checked to be the module its kind maps onto."""
    if not isinstance(c.model, cls):
        raise TypeError(f"a {c.kind} conversion gave {type(c.model).__name__}, not {cls.__name__}")
    return c.model


def _embedding(folder: HFFolder, c: Converted) -> dict:
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(str(folder.path), local_files_only=True).eval()
    ids, mask = _batch(c.tokenizer, TEXTS, c.max_input_tokens, c.special_tokens.get("pad", 0))
    with torch.no_grad():
        if not isinstance(c.model, (Encoder, DecoderEmbedder)):
            raise TypeError(f"an embedding conversion gave {type(c.model).__name__}, not an embedder")
        pooling = c.model.config.pooling
        ref = _pool(hf(input_ids=ids, attention_mask=mask).last_hidden_state, mask, pooling)
        got = c.model(ids, mask)
    cos = torch.nn.functional.cosine_similarity(ref.double(), got.double(), dim=-1)
    figures = {"cos_min": float(cos.min()), "inputs": len(TEXTS)}
    if figures["cos_min"] < parity.ENCODER_MIN_COS:
        parity._fail("embedding cosine vs transformers (min)", figures["cos_min"], parity.ENCODER_MIN_COS)
    return figures


def _logits_figures(ref: torch.Tensor, got: torch.Tensor, mask: torch.Tensor, what: str) -> dict:
    real = mask.bool()
    diff = float((ref[real] - got[real]).abs().max())
    top1 = float((ref[real].argmax(-1) == got[real].argmax(-1)).float().mean())
    if diff > LOGITS_MAX_ABS:
        parity._fail(f"{what} logits max abs diff vs transformers", diff, LOGITS_MAX_ABS)
    return {"logits_max_abs_diff": diff, "top1_agreement": top1, "positions": int(real.sum())}


def _fill_mask(folder: HFFolder, c: Converted) -> dict:
    from transformers import AutoModelForMaskedLM

    hf = AutoModelForMaskedLM.from_pretrained(str(folder.path), local_files_only=True).eval()
    ids, mask = _batch(c.tokenizer, TEXTS, c.max_input_tokens, c.special_tokens.get("pad", 0))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        got = c.model(ids, mask)
    return _logits_figures(ref, got, mask, "fill-mask")


def _sparse(folder: HFFolder, c: Converted) -> dict:
    """SPLADE weights: transformers' MLM logits pooled as SpladePooling does, vs ours end to end."""
    from transformers import AutoModelForMaskedLM

    hf = AutoModelForMaskedLM.from_pretrained(str(folder.path), local_files_only=True).eval()
    ids, mask = _batch(c.tokenizer, TEXTS, c.max_input_tokens, c.special_tokens.get("pad", 0))
    model = _ours(c, SpladeEncoder)
    with torch.no_grad():
        ref = model.pool(hf(input_ids=ids, attention_mask=mask).logits, mask)  # (B, V)
        got = model(ids, mask)
    diff = float((ref - got).abs().max())
    if diff > LOGITS_MAX_ABS:
        parity._fail("sparse weights max abs diff vs transformers", diff, LOGITS_MAX_ABS)
    same = bool(((ref > 0) == (got > 0)).all())
    return {"values_max_abs_diff": diff, "same_nonzero": same, "inputs": len(TEXTS)}


def _generation(folder: HFFolder, c: Converted) -> dict:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder.path), local_files_only=True).eval()
    model = _ours(c, GPTDecoder)
    figures: dict = {}
    greedy, stops = 0, 0
    ends = c.eos_token_ids or [c.special_tokens["eos"]]  # what the service stops at
    prompt_limit = min(32, model.config.max_positions - GREEDY_TOKENS)  # ours sees the whole sequence too
    for text in TEXTS[:4]:
        ids = torch.tensor([c.tokenizer.encode(text).ids[:prompt_limit]])
        with torch.no_grad():
            ref = hf(input_ids=ids).logits
            got = c.model(ids)[0]
            figures = _merge(figures, _logits_figures(ref, got, torch.ones_like(ids), "generation"))
            expected = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=GREEDY_TOKENS,
                do_sample=False,
                num_beams=1,
                eos_token_id=None,
                pad_token_id=0,
            )
            mine = model.generate(ids, GREEDY_TOKENS, stop_at_eos=False)
        if expected[0].tolist() != mine[0].tolist():
            raise parity.ParityError(
                f"greedy tokens differ from transformers' generate on {text!r}: "
                f"{mine[0, ids.shape[1] :].tolist()} vs {expected[0, ids.shape[1] :].tolist()}"
            )
        greedy += GREEDY_TOKENS
        new = mine[0, ids.shape[1] :].tolist()
        stop = next((i + 1 for i, t in enumerate(new) if t in ends), None)
        if stop is not None:  # the service stops there: so must generate, given the same end ids
            with torch.no_grad():
                stopped = hf.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=GREEDY_TOKENS,
                    do_sample=False,
                    num_beams=1,
                    eos_token_id=ends,
                    pad_token_id=0,
                )[0, ids.shape[1] :].tolist()
            if stopped != new[:stop]:
                raise parity.ParityError(
                    f"transformers' generate with eos_token_id {ends} stops elsewhere on {text!r}: "
                    f"{stopped} vs the end-token cut {new[:stop]}"
                )
            stops += 1
    return {**figures, "greedy_tokens_equal": greedy, "eos_stops_equal": stops}


def _translation(folder: HFFolder, c: Converted) -> dict:
    from transformers import AutoModelForSeq2SeqLM

    hf = AutoModelForSeq2SeqLM.from_pretrained(str(folder.path), local_files_only=True).eval()
    model = _ours(c, Translator)
    keep = torch.ones(model.config.vocab_size, dtype=torch.bool)  # (V,)
    keep[c.source.get("banned_tokens", [])] = False  # generate bans them, the converted logits bias does
    figures: dict = {}
    total = 0
    for text in TEXTS[:4]:
        ids = torch.tensor([c.tokenizer.encode(text).ids[:32]])
        mask = torch.ones_like(ids)
        with torch.no_grad():  # one token more: a forced_eos_token_id (Marian) replaces the last one with EOS
            expected = hf.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=GREEDY_TOKENS + 1, do_sample=False, num_beams=1
            )[0, 1:].tolist()  # without the decoder start token
            mine = model.greedy_decode(ids, mask, GREEDY_TOKENS)[0]
            target = torch.tensor([[model.config.decoder_start_token_id, *mine]])  # teacher-forced logits
            ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits[..., keep]
            got = c.model(ids, mask, target, torch.ones_like(target))[..., keep]
        if expected[: len(mine)] != mine:
            raise parity.ParityError(
                f"greedy translation differs from transformers' generate on {text!r}: {mine} vs {expected}"
            )
        figures = _merge(figures, _logits_figures(ref, got, torch.ones_like(target), "translation"))
        total += len(mine)
    return {**figures, "greedy_tokens_equal": total}


def _merge(a: dict, b: dict) -> dict:
    if not a:
        return b
    return {
        "logits_max_abs_diff": max(a["logits_max_abs_diff"], b["logits_max_abs_diff"]),
        "top1_agreement": min(a["top1_agreement"], b["top1_agreement"]),
        "positions": a["positions"] + b["positions"],
    }


CHECKS = {
    "embedding": _embedding,
    "fill-mask": _fill_mask,
    "generation": _generation,
    "translation": _translation,
    "sparse-embedding": _sparse,
}


def check(folder: HFFolder, converted: Converted) -> dict:
    """-> figures (rounded for the manifest); raises parity.ParityError on a miss."""
    if converted.kind == "classification":  # pairs and token types too: classifier_reference.py
        from export.convert import classifier_reference

        figures = classifier_reference.check(folder, converted, TEXTS)
    else:
        figures = {"tokenizer": _tokenizer_figures(folder, converted)}
        figures[converted.kind] = CHECKS[converted.kind](folder, converted)
    log.info("matches transformers: %s", figures)
    return rounded(figures)


def rounded(figures: dict) -> dict:
    return {
        k: rounded(v) if isinstance(v, dict) else float(f"{v:.4g}") if isinstance(v, float) else v
        for k, v in figures.items()
    }
