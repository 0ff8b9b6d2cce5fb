"""Quality figures for the trained models, computed in PyTorch.

- translator: sacrebleu BLEU and chrF on a grouped split, multi-reference (every French translation
  of an English sentence), decoding greedy (`greedy_decode`, the reference the ONNX loop must
  match) or with `beam_search`;
- generator: held-out perplexity over non-overlapping context windows, and sampled stories;
- mlm: held-out masked-token accuracy and perplexity against baselines (export/train/mlm_eval.py),
  overall and per corpus, and the top 5 fills of a few sample sentences.

`python -m export evaluate translator|generator|mlm CHECKPOINT_DIR [...]` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from export.models.decoder import GPTDecoder
from export.train import data

log = logging.getLogger(__name__)


def encode_sources(tok: Tokenizer, sentences: list[str], max_len: int) -> list[list[int]]:
    """Source ids ending in </s> (the tokenizer's post-processor adds it), cut to max_len."""
    out = []
    for enc in tok.encode_batch(sentences):
        ids = enc.ids
        out.append(ids if len(ids) <= max_len else [*ids[: max_len - 1], ids[-1]])
    return out


@torch.no_grad()
def translate(
    model, tok: Tokenizer, sentences: list[str], *, beam: int = 1, max_len: int = 64, batch_size: int = 64
) -> list[str]:
    """Translate in length-sorted batches; beam=1 is greedy (`Translator.greedy_decode`)."""
    model.eval()
    cfg = model.config
    device = next(model.parameters()).device
    src = encode_sources(tok, sentences, max_len)
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    hyps: list[str] = [""] * len(src)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        ids, mask = data.pad([src[i] for i in idx], cfg.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        limit = min(max_len, int(ids.shape[1] * 1.5) + 10)
        if beam == 1:
            outs = model.greedy_decode(ids, mask, limit)
        else:
            outs = beam_search(model, ids, mask, beam_size=beam, max_length=limit)
        for i, out in zip(idx, outs):
            hyps[i] = tok.decode(out, skip_special_tokens=True)
    return hyps


def translation_scores(hyps: list[str], refs: list[list[str]]) -> dict:
    """Corpus BLEU and chrF against a variable number of references per sentence."""
    width = max(len(r) for r in refs)
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
    bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
    refs_by_stream = cast(list[Sequence[str]], streams)  # sacrebleu skips None (a missing reference); its hint says str
    bleu, chrf = bleu_metric.corpus_score(hyps, refs_by_stream), chrf_metric.corpus_score(hyps, refs_by_stream)
    return {
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
        "bleu_detail": bleu.format(),
        "signature": f"{bleu_metric.get_signature()} {chrf_metric.get_signature()}",
        "sentences": len(hyps),
        "references": sum(len(r) for r in refs),
    }


def evaluate_translator(
    model, tok: Tokenizer, items: list[tuple[str, list[str]]], *, beam: int = 1, max_len: int = 64
) -> tuple[dict, list[str]]:
    hyps = translate(model, tok, [en for en, _ in items], beam=beam, max_len=max_len)
    return translation_scores(hyps, [refs for _, refs in items]), hyps


def _select_beams(cand, flat, seqs, finished, K: int, V: int, eos: int, pad: int, length_penalty: float):
    """From the 2K best (score, beam*V + token) candidates per source (B, 2K): hypotheses ending in
    EOS join `finished`; the best K others stay live. Returns their scores (B, K), source rows
    (B, K) into seqs, and next tokens (B, K); unfilled slots get score -inf."""
    B = cand.shape[0]
    scores = torch.full((B, K), -math.inf, device=cand.device)
    select = torch.zeros((B, K), dtype=torch.long, device=cand.device)
    next_tok = torch.full((B, K), pad, dtype=torch.long, device=cand.device)
    for b in range(B):
        live = 0
        for score, f in zip(cand[b].tolist(), flat[b].tolist()):
            if live == K or len(finished[b]) >= K or score == -math.inf:
                break
            beam, tok = divmod(f, V)
            if tok == eos:
                hyp = [*seqs[b * K + beam, 1:].tolist(), tok]
                finished[b].append((score / len(hyp) ** length_penalty, hyp))
                continue
            scores[b, live], select[b, live], next_tok[b, live] = score, b * K + beam, tok
            live += 1
    return scores, select, next_tok


@torch.no_grad()
def beam_search(
    model,
    src_ids: torch.Tensor,
    src_mask: torch.Tensor,
    *,
    beam_size: int = 4,
    max_length: int = 64,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """Batched beam search with the self-attention KV cache (fairseq-style: a hypothesis ends at
    </s>; finished scores are log p / length**length_penalty; a sentence is done once it has
    beam_size finished hypotheses). src (B, S) -> best token ids per source, without the start token, with EOS."""
    cfg, B, K = model.config, src_ids.shape[0], beam_size
    device = src_ids.device
    cross = [
        (k.repeat_interleave(K, 0), v.repeat_interleave(K, 0))  # (B*K, nh, S, hs)
        for k, v in model.encode(src_ids, src_mask)
    ]
    src_mask_k = src_mask.repeat_interleave(K, 0)  # (B*K, S)
    scores = torch.full((B, K), -math.inf, device=device)
    scores[:, 0] = 0.0  # one live beam per source at the start
    seqs = torch.full((B * K, 1), cfg.decoder_start_token_id, dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    past = None
    for t in range(max_length):
        positions = torch.full((B * K, 1), t, dtype=torch.long, device=device)
        mask = torch.ones((B * K, t + 1), dtype=torch.long, device=device)
        logits, past = model.decode(seqs[:, -1:], mask, positions, past, cross, src_mask_k)
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B*K, V)
        V = logp.shape[-1]
        cand, flat = (scores.view(-1, 1) + logp).view(B, K * V).topk(2 * K, dim=1)  # (B, 2K)
        scores, select, next_tok = _select_beams(
            cand, flat, seqs, finished, K, V, cfg.eos_token_id, cfg.pad_token_id, length_penalty
        )
        if all(len(f) >= K for f in finished):
            break
        sel = select.view(-1)
        seqs = torch.cat([seqs[sel], next_tok.view(-1, 1)], dim=1)  # (B*K, t+2)
        past = [(k[sel], v[sel]) for k, v in past]
    for b in range(B):  # sources that hit max_length: their live beams compete too
        if len(finished[b]) < K:
            for k in range(K):
                if scores[b, k] > -math.inf:
                    hyp = seqs[b * K + k, 1:].tolist()
                    finished[b].append((float(scores[b, k]) / max(1, len(hyp)) ** length_penalty, hyp))
    return [max(f, key=lambda x: x[0])[1] for f in finished]


@torch.no_grad()
def perplexity(model, windows: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """exp(mean next-token NLL) over every predicted token of the held-out windows."""
    model.eval()
    device = next(model.parameters()).device
    nll, count = 0.0, 0
    for x, y in windows:
        logits, _ = model(x.to(device))
        nll += float(F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), reduction="sum"))
        count += y.numel()
    return {"perplexity": round(math.exp(nll / count), 3), "nll": round(nll / count, 4), "tokens": count}


MLM_SAMPLES = [
    "The cat sat on the [MASK].",
    "Once upon a time, there was a little [MASK].",
    "She was very [MASK] and wanted to play with her friends.",
    "The [MASK] of France is Paris.",
    "To be, or not to [MASK]: that is the question.",
]


@torch.no_grad()
def sample_stories(
    model,
    tok: Tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
) -> list[str]:
    """Top-k sampled continuations of each prompt (the prompt gets the leading <|endoftext|>)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    eos = model.config.eos_token_id
    out = []
    for prompt in prompts:
        ids = torch.tensor([tok.encode(prompt).ids], device=next(model.parameters()).device)  # (1, T)
        for _ in range(max_new_tokens):
            logits, _ = model(ids[:, -model.config.max_positions :])
            top = torch.topk(logits[0, -1] / temperature, top_k)
            pick = torch.multinomial(torch.softmax(top.values, -1).cpu(), 1, generator=gen)  # the CPU generator
            nxt = top.indices[pick.to(top.indices.device)]
            if int(nxt) == eos:
                break
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        out.append(tok.decode(ids[0].tolist(), skip_special_tokens=True))
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export evaluate", description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=["generator", "translator", "mlm"])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--data", type=Path, help="corpus (default: the shared corpus for the kind)")
    p.add_argument("--split", choices=["dev", "test"], default="test")
    p.add_argument("--beam", type=int, nargs="+", default=[1, 4], help="beam sizes to score (1 = greedy)")
    p.add_argument("--seed", type=int, default=0, help="split seed used in training")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all)")
    p.add_argument("--hyps-out", type=Path, help="write hypotheses (translator) or samples (generator) here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from export.train.checkpoint import load_checkpoint

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv[1:] if argv and argv[0] == "evaluate" else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, meta = load_checkpoint(args.checkpoint)
    tok = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json"))
    path = args.data or data.DEFAULT_DATA[args.kind]
    training = meta.get("training", {})
    seed, sizes = training.get("seed", args.seed), training.get("split", {})
    result: dict = {"checkpoint": str(args.checkpoint), "split": args.split if args.kind == "translator" else "heldout"}
    if args.kind == "mlm":  # held-out masked tokens vs the unigram baseline, from the checkpoint's own files
        from export.train import mlm_eval

        neighbours = None
        if Path(path).is_dir():  # the training split's text, for the neighbour baseline
            from export.train import mlm_data

            train, _ = mlm_data.split_passages(mlm_data.load_passages(path), seed=seed)
            tok.no_truncation()
            neighbours = mlm_eval.NeighbourLookup(e.ids[1:-1] for ps in train.values() for e in tok.encode_batch(ps))
        result["heldout"] = mlm_eval.checkpoint_figures(args.checkpoint, model, meta, tok, neighbours=neighbours)
        texts = [f"{t}\t{mlm_eval.fill(model, tok, t)}" for t in MLM_SAMPLES]
        result["samples"] = texts
    elif args.kind == "translator":
        split = data.split_tatoeba(
            data.load_tatoeba(path), seed=seed, n_test=sizes.get("test", 2000), n_dev=sizes.get("dev", 1000)
        )
        items = split.test if args.split == "test" else split.dev
        texts = []
        for beam in args.beam:
            scores, hyps = evaluate_translator(model, tok, items, beam=beam, max_len=meta["max_length"])
            result["greedy" if beam == 1 else f"beam{beam}"] = scores
            texts += [f"[beam {beam}] {en}\t{h}" for (en, _), h in zip(items, hyps)]
    else:
        if not isinstance(model, GPTDecoder):
            raise SystemExit(f"{args.checkpoint}: a {meta['architecture']} checkpoint, not a generator (--kind)")
        _, held = data.split_stories(data.load_stories(path), seed=seed)
        stream = data.story_stream([e.ids[1:] for e in tok.encode_batch(held)], model.config.eos_token_id)
        result["heldout"] = perplexity(model, data.stream_windows(stream, model.config.max_positions))
        texts = sample_stories(model, tok, ["Once upon a time", "Tom and Lily went to the park.", "One day, a little"])
        result["samples"] = texts
    if args.hyps_out:
        args.hyps_out.write_text("\n".join(texts) + "\n", encoding="utf-8")
    sys.stdout.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
