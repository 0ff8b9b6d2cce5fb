"""The parity gate: every exported graph must compute what the PyTorch model computes.

Run at every export; a miss raises `ParityError` and no model directory is written. Exact variants
(fp32, optimized) must match PyTorch: embeddings by cosine, logits by max abs difference at prefill
and at decode steps, greedy tokens of a batched onnxruntime KV-cache loop equal to the PyTorch
reference (`VARIANT_LIMITS`). Reduced-precision variants (fp16, int8, int4) are judged on the model's
quality over a text sample instead (`QUALITY_LIMITS`, `EMBEDDING_QUALITY_LIMITS`): `quality_ok`
decides whether `variant=auto` may serve them. The figures go into the manifest; the checks and
their thresholds are described in docs/design/export.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from export.onnx import store

log = logging.getLogger(__name__)

ENCODER_MIN_COS = 0.99999
LOGITS_MAX_ABS = 1e-4
GREEDY_NEW_TOKENS = 64
# Per variant: (min embedding cosine, max logits abs diff or None = recorded only, greedy must match).
VARIANT_LIMITS = {
    "fp32": (ENCODER_MIN_COS, LOGITS_MAX_ABS, True),
    "optimized": (ENCODER_MIN_COS, LOGITS_MAX_ABS, True),
    "fp16": (0.999, None, False),
    "int8": (0.95, None, False),
    "int4": (0.95, None, False),
}

# A reduced-precision variant keeps the model's quality when, teacher-forced on the sample, its
# perplexity is within 1 % of PyTorch's and >= 95 % of positions have the same most likely token.
# It must also be batch-invariant: a row's logits may not depend on the rows batched with it (the
# service promises the same greedy output alone or in a crowd; onnxruntime's quantize_dynamic
# scales activations per tensor, i.e. per batch, and moved a row's logits by 0.35 here).
QUALITY_LIMITS = {"perplexity_ratio_max": 1.01, "top1_agreement_min": 0.95, "batch_max_abs_diff": LOGITS_MAX_ABS}
# An encoder variant keeps the model's quality when, on the sample, its embeddings stay within these
# cosines of PyTorch's, the Spearman correlation between PyTorch's and its pairwise cosine
# similarities is at least 0.99, and it is batch-invariant like the decoders. (all-MiniLM-L6-v2,
# row-wise int8, 553 held-out texts: cos min 0.990, mean 0.997; docs/performance.md.)
EMBEDDING_QUALITY_LIMITS = {
    "cos_min": 0.98,
    "cos_mean": 0.995,
    "similarity_spearman_min": 0.99,
    "batch_max_abs_diff": LOGITS_MAX_ABS,
}
# intra-op threads of a gate session: the CPUs this process may run on
GATE_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
BATCH_ROWS = 8  # rows of the sample computed together for the batch-invariance check
# ... each cut to its first BATCH_TOKENS inputs: a causal row's first n logits are its prefix's, and
# one long gate text padded the batch to 885 positions of GPT-2's vocabulary (8 x 885 x 50,257
# floats, 1.4 GB a copy: a third of a converted decoder's export time went to it).
BATCH_TOKENS = 128
QUALITY_CHUNK = 64  # positions per float64 log-softmax in quality_figures (a (T, V) one was 356 MB at T 885)
FP16_BATCH_ULPS = 2  # an fp16 row may move this many float16 units in the last place between batches


def batch_limit(variant: str, peak: float) -> float:
    """How far a row's outputs may move between computed alone and in a batch, their largest
    magnitude being peak. fp32 and int8 variants: LOGITS_MAX_ABS. fp16: FP16_BATCH_ULPS units in the
    last place of float16 at peak: another batch shape may sum in another order (another kernel on
    CUDA, other blocking on a CPU) and each order rounds to float16, so one ulp apart is a different
    rounding, not a row reading its neighbours (int8's per-batch activation scales moved one by 0.35).
    With the absolute limit no fp16 encoder or translator was admitted (0.0078 = 1 ulp at 8-16 on an
    H200), so CUDA served their fp32 graphs."""
    if variant != "fp16":
        return LOGITS_MAX_ABS
    return max(LOGITS_MAX_ABS, FP16_BATCH_ULPS * float(np.spacing(np.float16(min(peak, 65504.0)))))


Past = list[np.ndarray]  # flat: layer 0 key, layer 0 value, layer 1 key, ...
Step = Callable[[np.ndarray, np.ndarray, np.ndarray, Past | None], tuple[np.ndarray, Past]]


class ParityError(RuntimeError):
    """An exported graph does not match its PyTorch model; the message says which check and by how much."""


def session(path: Path, prepack: bool | None = None, threads: int | None = None) -> ort.InferenceSession:
    """A CPU session with `threads` intra-op threads (default GATE_THREADS: the CPUs this process
    may run on). The gate's figures should not depend on it (onnxruntime's CPU kernels divide a
    product's rows and columns among threads, not its sums), and GPT-2 small's default conversion
    recorded the same figures, to the last digit, with 1 and 2 threads (178 s -> 163 s, 2-vCPU AMD
    EPYC). The decode-step timing for `auto` asks for one (export/gate/speed.py).

    `prepack` None: not for a graph with an external data file (export/onnx/store.py): without
    prepacked weights onnxruntime maps that file instead of copying it, so a 1.1B fp32 gate session
    costs 0.07 GB instead of 4.4 GB and 0.1 s to open instead of 15 (its 8-row steps are slower,
    which the gate does not time: export/gate/speed.py prepacks as the service does)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or GATE_THREADS
    opts.inter_op_num_threads = 1
    if prepack is None:
        prepack = not store.data_file(Path(path)).exists()
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, left: bool) -> tuple[np.ndarray, np.ndarray]:
    """-> ids, attention_mask (B, L) padded to the longest row, on the left or the right."""
    longest = max(len(s) for s in seqs)
    ids = np.full((len(seqs), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), longest), dtype=np.int64)
    for row, s in enumerate(seqs):
        cols = slice(longest - len(s), longest) if left else slice(0, len(s))
        ids[row, cols], mask[row, cols] = s, 1
    return ids, mask


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30)


def _fail(what: str, value: float, limit: float) -> None:
    raise ParityError(f"parity gate: {what} = {value:.3g}, limit {limit:g}")


# ---- embedding ----------------------------------------------------------------------------------


class EmbeddingReference:
    """PyTorch's pooled, unnormalised embeddings (B, C) of right-padded batches, each distinct batch
    computed once. Every variant's gate (fp32 to int8, the padded and the packed graph, parity and
    quality) compares with the same rows of the same batches, so one object serves a model's whole
    export: PyTorch ran the 553-text quality sample four times per reduced-precision variant
    before (28 % of MiniLM's export). It holds (texts x C) floats: a few MB."""

    def __init__(self, model, pad_id: int):
        self.model, self.pad_id = model, pad_id
        self._rows: dict[tuple[tuple[int, ...], ...], np.ndarray] = {}

    def __call__(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        key = tuple(tuple(s) for s in batch)
        rows = self._rows.get(key)
        if rows is None:
            ids, mask = pad_batch(batch, self.pad_id, left=False)
            with torch.no_grad():
                rows = self.model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
            rows.flags.writeable = False  # shared by every caller
            self._rows[key] = rows
        return rows


def encoder_parity(
    model,
    graph: Path,
    batches: Sequence[Sequence[Sequence[int]]],
    pad_id: int,
    variant: str = "fp32",
    reference: EmbeddingReference | None = None,
) -> dict:
    """ONNX embeddings vs PyTorch (pooled, unnormalised) on right-padded batches."""
    sess, reference = session(graph), reference or EmbeddingReference(model, pad_id)
    cos, diff, n = [], 0.0, 0
    for batch in batches:
        ids, mask = pad_batch(batch, pad_id, left=False)
        ref = reference(batch)  # (B, C)
        got = sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float32)
        cos.append(_cos(ref, got))
        diff = max(diff, float(np.abs(ref - got).max()))
        n += len(batch)
    cos_min = float(np.concatenate(cos).min())
    figures = {"cos_min": cos_min, "cos_mean": float(np.concatenate(cos).mean()), "max_abs_diff": diff, "inputs": n}
    limit = VARIANT_LIMITS[variant][0]
    if cos_min < limit:
        _fail(f"{variant} encoder cosine vs PyTorch (min over {n} inputs)", cos_min, limit)
    return figures


def _ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(x), np.float64)
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    return ranks


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def _pair_similarities(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-30)
    return (x @ x.T)[np.triu_indices(len(x), 1)]


def encoder_quality(
    model,
    graph: Path,
    sample: Sequence[Sequence[int]],
    sample_name: str,
    pad_id: int,
    batch_size: int = 32,
    variant: str = "int8",
    reference: EmbeddingReference | None = None,
) -> dict:
    """A reduced-precision encoder on a text sample, against PyTorch: cosine per text, Spearman of
    the pairwise similarities, and how far a row moves between alone and batched.
    -> {"quality": figures and limits, "quality_ok": within EMBEDDING_QUALITY_LIMITS}."""
    sess, reference = session(graph), reference or EmbeddingReference(model, pad_id)

    def embed(batch) -> np.ndarray:
        ids, mask = pad_batch(batch, pad_id, left=False)
        return sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float32)

    chunks = [sample[i : i + batch_size] for i in range(0, len(sample), batch_size)]
    ref = np.concatenate([reference(c) for c in chunks])
    got = np.concatenate([embed(c) for c in chunks])
    cos = _cos(ref, got)
    alone = np.concatenate([embed([seq]) for seq in sample[:batch_size]])
    batch_diff = float(np.abs(alone - got[: len(alone)]).max())
    limits = {**EMBEDDING_QUALITY_LIMITS, "batch_max_abs_diff": batch_limit(variant, float(np.abs(got).max()))}
    figures: dict[str, Any] = {
        "sample": sample_name,
        "texts": len(sample),
        "cos_min": round(float(cos.min()), 5),
        "cos_mean": round(float(cos.mean()), 5),
        "similarity_spearman": round(_spearman(_pair_similarities(ref), _pair_similarities(got)), 5),
        "batch_max_abs_diff": float(f"{batch_diff:.3g}"),
        "limits": limits,
    }
    ok = (
        figures["cos_min"] >= limits["cos_min"]
        and figures["cos_mean"] >= limits["cos_mean"]
        and figures["similarity_spearman"] >= limits["similarity_spearman_min"]
        and batch_diff <= limits["batch_max_abs_diff"]
    )
    log.info("quality on %s: %s -> %s", sample_name, figures, "ok" if ok else "below the limits")
    return {"quality": figures, "quality_ok": ok}


# ---- decoding steps -----------------------------------------------------------------------------


def onnx_step(
    sess: ort.InferenceSession, fixed: dict[str, np.ndarray] | None = None, max_length: int | None = None
) -> Step:
    """A decoding step through an ONNX decoder graph; float inputs are cast to the graph's dtype.

    A GroupQueryAttention decoder (a `seqlens_k` input) keeps its cache in buffers of
    `max_length` slots: see `_buffer_step`."""
    past_names = [i.name for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    float_type = {i.name: np.float16 if i.type == "tensor(float16)" else np.float32 for i in sess.get_inputs()}
    fixed = {k: v.astype(float_type[k]) if v.dtype.kind == "f" else v for k, v in (fixed or {}).items()}
    if "seqlens_k" in float_type:
        if not max_length:
            raise ValueError("a GroupQueryAttention decoder needs max_length (its KV buffer size)")
        return _buffer_step(sess, past_names, float_type, max_length, fixed)

    def step(ids, mask, pos, past):
        if past is None:
            kv_shape = sess.get_inputs()[len(sess.get_inputs()) - 1].shape
            past = [np.zeros((ids.shape[0], kv_shape[1], 0, kv_shape[3]), np.float32)] * len(past_names)
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, **fixed}
        feeds.update({n: p.astype(float_type[n], copy=False) for n, p in zip(past_names, past)})
        logits, *present = sess.run(None, feeds)
        return logits.astype(np.float32, copy=False), [p.astype(np.float32, copy=False) for p in present]

    return step


def _buffer_step(
    sess: ort.InferenceSession, past_names: list[str], float_type: dict, max_length: int, fixed: dict
) -> Step:
    """The Step of a GroupQueryAttention decoder (export/onnx/graphs.py): takes the same
    left-padded batches as the other steps and returns the same logits, while the graph sees each
    row left-aligned in a KV buffer of max_length slots with its length in `seqlens_k`. fixed:
    inputs with a row per batch row that every step takes as they are (a translator's cross K/V
    and source mask). The
    "past" it hands back is (buffers, lengths), the buffers in the graph's own float type: an fp16
    graph's 1,024-slot buffers cast to fp32 and back every step took 24 s of a GPT-2 small
    conversion's gate."""
    spec = sess.get_inputs()[len(sess.get_inputs()) - 1].shape  # (batch, H, max_sequence, D)
    every = "logits_positions" in float_type  # the graph projects only where asked: every position here

    def run(ids, pos, lengths_after, buffers, rows=slice(None)):
        feeds = {
            **{name: value[rows] for name, value in fixed.items()},
            "input_ids": ids,
            "position_ids": pos,
            "seqlens_k": (lengths_after - 1).astype(np.int32),
            "total_sequence_length": np.asarray(lengths_after.max(), np.int32),
            **dict(zip(past_names, buffers)),  # already in the graph's type (kept so between steps)
        }
        if every:
            feeds["logits_positions"] = np.ascontiguousarray(np.broadcast_to(np.arange(ids.shape[1]), ids.shape))
        logits, *present = sess.run(None, feeds)
        return logits.astype(np.float32, copy=False), present  # the buffers stay in the graph's type

    def step(ids, mask, pos, past):
        rows, new = ids.shape
        if past is None:  # prefill: left-padded rows -> left-aligned rows of their own lengths
            lengths = mask.sum(axis=1).astype(np.int64)  # (B,)
            aligned_ids, aligned_pos = np.zeros_like(ids), np.zeros_like(pos)
            for b, n in enumerate(lengths):
                aligned_ids[b, :n], aligned_pos[b, :n] = ids[b, new - n :], pos[b, new - n :]
            buffers = [np.zeros((rows, spec[1], max_length, spec[3]), float_type[n]) for n in past_names]
            out, present = run(aligned_ids, aligned_pos, lengths, buffers)
            logits = np.zeros_like(out)
            for b, n in enumerate(lengths):
                logits[b, new - n :] = out[b, :n]
            return logits, (present, lengths)
        buffers, lengths = past
        if new == 1 or rows == 1:
            logits, present = run(ids, pos, lengths + new, buffers)
            return logits, (present, lengths + new)
        # GroupQueryAttention takes several new tokens after a past for one row at a time.
        outs = [
            run(
                ids[b : b + 1],
                pos[b : b + 1],
                lengths[b : b + 1] + new,
                [a[b : b + 1] for a in buffers],
                slice(b, b + 1),
            )
            for b in range(rows)
        ]
        present = [np.concatenate([o[1][i] for o in outs]) for i in range(len(past_names))]
        return np.concatenate([o[0] for o in outs]), (present, lengths + new)

    return step


def torch_step(fn: Callable, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Step:
    """Wraps fn(ids, mask, pos, past pairs | None) -> (logits, present pairs) into a numpy Step; the
    tensors go to `device`, the cache in `dtype` (the model's), and come back as float32 arrays."""

    def to(a: np.ndarray, float_type: torch.dtype | None = None) -> torch.Tensor:
        return torch.from_numpy(a).to(device, float_type)

    def step(ids, mask, pos, past):
        pairs = None if past is None else [(to(past[i], dtype), to(past[i + 1], dtype)) for i in range(0, len(past), 2)]
        with torch.no_grad():
            logits, present = fn(to(ids), to(mask), to(pos), pairs)
        return logits.float().cpu().numpy(), [t.float().cpu().numpy() for kv in present for t in kv]

    return step


def prompt_positions(mask: np.ndarray) -> np.ndarray:
    """Position ids for a left-padded batch: 0 at each row's first real token (pads get 0)."""
    return np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int64)


def logits_parity(ref: Step, got: Step, prompts: Sequence[Sequence[int]], pad_id: int, vocab: int) -> dict:
    """Max abs logits diff at prefill (past 0) and at two decode steps (past > 0), left-padded batch."""
    ids, mask = pad_batch(prompts, pad_id, left=True)
    pos = prompt_positions(mask)
    (ref_logits, ref_past), (got_logits, got_past) = ref(ids, mask, pos, None), got(ids, mask, pos, None)
    valid = mask.astype(bool)  # (B, L): compare real tokens only; padded rows are fully masked
    prefill = float(np.abs(ref_logits - got_logits)[valid].max())
    decode, past_lengths = 0.0, []
    rng = np.random.default_rng(0)
    for new in (3, 1):
        past_lengths.append(mask.shape[1])
        ids = rng.integers(0, vocab, (len(prompts), new), dtype=np.int64)  # (B, T)
        pos = pos[:, -1:] + 1 + np.arange(new)[None, :]  # (B, T)
        mask = np.concatenate([mask, np.ones((len(prompts), new), np.int64)], axis=1)  # (B, P+T)
        (ref_logits, ref_past), (got_logits, got_past) = ref(ids, mask, pos, ref_past), got(ids, mask, pos, got_past)
        decode = max(decode, float(np.abs(ref_logits - got_logits).max()))
    return {"prefill_max_abs_diff": prefill, "decode_max_abs_diff": decode, "decode_past_lengths": past_lengths}


def greedy_loop(step: Step, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, n_new: int) -> np.ndarray:
    """Batched greedy decoding with the KV cache: prefill, then one token per step. -> (B, n_new)."""
    past, out = None, []
    for _ in range(n_new):
        logits, past = step(ids, mask, pos, past)
        ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
        out.append(ids)
        mask = np.concatenate([mask, np.ones_like(ids)], axis=1)  # (B, P+1)
        pos = pos[:, -1:] + 1  # (B, 1)
    return np.concatenate(out, axis=1)


def compare_tokens(ref: Sequence[Sequence[int]], got: np.ndarray, exact: bool, what: str) -> dict:
    """Token agreement of greedy continuations; with exact=True any difference fails the gate."""
    agree = []
    for row, (r, g) in enumerate(zip(ref, got.tolist())):
        first = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), len(r))
        if exact and (first < len(r) or len(g) != len(r)):
            raise ParityError(
                f"parity gate: {what}: sequence {row} differs from the PyTorch reference at "
                f"new token {first} (reference {r[first : first + 4]}, onnx {g[first : first + 4]})"
            )
        agree.append(first / len(r))
    return {
        "greedy_new_tokens": len(ref[0]),
        "greedy_sequences": len(ref),
        "greedy_prefix_agreement": float(np.mean(agree)),
        "greedy_identical": all(a == 1.0 for a in agree),
    }


def _check_logits(figures: dict, variant: str, what: str) -> None:
    limit = VARIANT_LIMITS[variant][1]
    for key in ("prefill_max_abs_diff", "decode_max_abs_diff"):
        if limit is not None and figures[key] > limit:
            _fail(f"{variant} {what} {key.replace('_', ' ')}", figures[key], limit)


# ---- generation ---------------------------------------------------------------------------------


def reference_generations(model, prompts: Sequence[Sequence[int]], n_new: int = GREEDY_NEW_TOKENS) -> list[list[int]]:
    """`GPTDecoder.generate` per prompt (no EOS stop): the tokens the ONNX loop must produce."""
    if max(len(p) for p in prompts) + n_new > model.config.max_positions:
        raise ValueError(f"prompts too long for {n_new} new tokens within max_positions {model.config.max_positions}")
    device = next(model.parameters()).device
    return [
        model.generate(torch.tensor([p], device=device), n_new, stop_at_eos=False)[0, len(p) :].tolist()
        for p in prompts
    ]


def decoder_parity(
    model,
    graph: Path,
    prompts: Sequence[Sequence[int]],
    variant: str = "fp32",
    n_new: int = GREEDY_NEW_TOKENS,
    reference: list[list[int]] | None = None,
) -> dict:
    """GPT decoder graph vs `GPTDecoder`: logits at prefill and decode, greedy tokens vs `generate`.

    reference: `reference_generations(model, prompts, n_new)` when already computed (variants)."""
    cfg = model.config
    # KV buffers as long as these checks reach (the prompts, then 3 + 1 tokens or n_new), not the
    # whole context: onnxruntime copies an unshared past buffer into the present one every step.
    reach = max(map(len, prompts)) + max(n_new, 4)
    got = onnx_step(session(graph), max_length=min(cfg.max_positions, reach))
    figures = logits_parity(torch_step(model), got, prompts, cfg.pad_token_id, cfg.vocab_size)
    _check_logits(figures, variant, "decoder logits")
    reference = reference or reference_generations(model, prompts, n_new)
    ids, mask = pad_batch(prompts, cfg.pad_token_id, left=True)
    tokens = greedy_loop(got, ids, mask, prompt_positions(mask), n_new)
    figures.update(compare_tokens(reference, tokens, VARIANT_LIMITS[variant][2], f"{variant} decoder greedy"))
    return figures


# ---- quality of reduced-precision variants (teacher-forced) ---------------------------------------


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def quality_figures(rows, sample: str, batch_max_abs_diff: float, variant: str = "int8") -> dict:
    """rows: (PyTorch logits (T, V), variant logits (T, V), next-token targets (T,)) per sequence;
    batch_max_abs_diff: how far a row's logits move when it is computed in a batch (`_batch_diff`).
    -> {"quality": perplexities, ratio, top-1 agreement, mean KL(PyTorch || variant), batch
        difference, limits; "quality_ok": within QUALITY_LIMITS}."""
    tokens, nll_ref, nll_got, kl, same, peak = 0, 0.0, 0.0, 0.0, 0, 0.0
    for ref_rows, got_rows, all_targets in rows:
        peak = max(peak, float(np.abs(got_rows).max()))
        for at in range(0, len(all_targets), QUALITY_CHUNK):  # float64 (chunk, V) arrays, not (T, V)
            ref, got = ref_rows[at : at + QUALITY_CHUNK], got_rows[at : at + QUALITY_CHUNK]
            targets = all_targets[at : at + QUALITY_CHUNK]
            lr, lg = log_softmax(ref), log_softmax(got)
            index = np.arange(len(targets))
            nll_ref -= float(lr[index, targets].sum())
            nll_got -= float(lg[index, targets].sum())
            kl += float((np.exp(lr) * (lr - lg)).sum())
            same += int((ref.argmax(-1) == got.argmax(-1)).sum())
            tokens += len(targets)
    ppl_ref, ppl = float(np.exp(nll_ref / tokens)), float(np.exp(nll_got / tokens))
    figures: dict[str, Any] = {
        "sample": sample,
        "tokens": tokens,
        "perplexity_pytorch": round(ppl_ref, 4),
        "perplexity": round(ppl, 4),
        "perplexity_ratio": round(ppl / ppl_ref, 5),
        "top1_agreement": round(same / tokens, 5),
        "kl_mean": float(f"{kl / tokens:.4g}"),
        "batch_max_abs_diff": float(f"{batch_max_abs_diff:.3g}"),
        "limits": (limits := {**QUALITY_LIMITS, "batch_max_abs_diff": batch_limit(variant, peak)}),
    }
    ok = (
        figures["perplexity_ratio"] <= QUALITY_LIMITS["perplexity_ratio_max"]
        and figures["top1_agreement"] >= QUALITY_LIMITS["top1_agreement_min"]
        and batch_max_abs_diff <= limits["batch_max_abs_diff"]
    )
    log.info("quality on %s: %s -> %s", sample, figures, "ok" if ok else "below the limits")
    return {"quality": figures, "quality_ok": ok}


def forced_logits(step: Step, seq: Sequence[int]) -> np.ndarray:
    """Logits (T, V) of one sequence's prefill (inputs seq[:-1], no past)."""
    ids = np.asarray([seq[:-1]], np.int64)
    return step(ids, np.ones_like(ids), np.arange(ids.shape[1], dtype=np.int64)[None, :], None)[0][0]


class ForcedReference:
    """PyTorch's teacher-forced logits (T, V) per sequence, each computed once per export: the
    quality gate of every reduced-precision variant (fp16, int8, int4; a translator's padded and
    packed encoders alike) compares with the same rows, which PyTorch recomputed for each before
    (GPT-2 small: 2.9 s a variant). Held by the model's kind (export/kinds.py); it keeps
    (tokens x V) float32 logits, 200 MB for GPT-2 small's 996 gate tokens, held while the next
    variant is built and gated, whose own peak is higher (docs/performance.md)."""

    def __init__(self, compute: Callable[..., np.ndarray]):
        self.compute = compute
        self._rows: dict[tuple, np.ndarray] = {}

    def __call__(self, *key_parts: Sequence[int]) -> np.ndarray:
        key = tuple(tuple(int(t) for t in part) for part in key_parts)
        rows = self._rows.get(key)
        if rows is None:
            rows = self.compute(*key_parts)
            rows.flags.writeable = False  # shared by every variant's gate
            self._rows[key] = rows
        return rows

    @staticmethod
    def decoder(model) -> ForcedReference:
        """A `GPTDecoder`'s logits of one sequence's prefill (inputs seq[:-1])."""
        step = torch_step(model)
        return ForcedReference(lambda seq: forced_logits(step, seq))

    @staticmethod
    def translator(model) -> ForcedReference:
        """A `Translator`'s decoder logits over a target (inputs tgt[:-1]), given its source."""

        def compute(src: Sequence[int], tgt: Sequence[int]) -> np.ndarray:
            ids = torch.tensor([list(src)])
            mask = torch.ones_like(ids)
            with torch.no_grad():
                cross = model.encode(ids, mask)
            return forced_logits(torch_step(lambda i, m, p, past: model.decode(i, m, p, past, cross, mask)), tgt)

        return ForcedReference(compute)


def _batch_diff(step: Step, seqs: Sequence[Sequence[int]], alone: Sequence[np.ndarray], pad_id: int) -> float:
    """Max abs difference between each sequence's prefill logits computed alone (`alone`) and
    computed together with the others in one left-padded batch, over its first BATCH_TOKENS
    inputs (causal: the logits at those positions are the same with or without the rest)."""
    inputs = [s[:-1][:BATCH_TOKENS] for s in seqs]
    ids, mask = pad_batch(inputs, pad_id, left=True)
    logits = step(ids, mask, prompt_positions(mask), None)[0]  # (B, T, V)
    return max(
        float(np.abs(logits[b, ids.shape[1] - len(x) :] - a[: len(x)]).max())
        for b, (x, a) in enumerate(zip(inputs, alone))
    )


def decoder_quality(
    model,
    graph: Path,
    sequences: Sequence[Sequence[int]],
    sample: str,
    variant: str = "int8",
    reference: ForcedReference | None = None,
) -> dict:
    """Teacher-forced quality of a decoder graph vs `GPTDecoder` over token sequences (<= context);
    reference: the export's `ForcedReference.decoder(model)`, shared by its variants."""
    ref = reference or ForcedReference.decoder(model)
    got = onnx_step(session(graph), max_length=model.config.max_positions)
    alone = [forced_logits(got, s) for s in sequences]
    batch = _batch_diff(got, sequences[:BATCH_ROWS], alone[:BATCH_ROWS], model.config.pad_token_id)
    return quality_figures(((ref(s), a, np.asarray(s[1:])) for s, a in zip(sequences, alone)), sample, batch, variant)


def translator_quality(
    model,
    encoder_graph: Path,
    decoder_graph: Path,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    sample: str,
    encode: Callable | None = None,
    variant: str = "int8",
    reference: ForcedReference | None = None,
) -> dict:
    """Teacher-forced quality of encoder + decoder graphs vs `Translator` over (source ids, target ids
    starting with the decoder start token) pairs, one pair at a time (no padding involved).
    encode: source rows -> (cross K/V, source mask) in place of the padded encoder graph's run
    (the packed encoder, export/onnx/packed.py); reference: the export's
    `ForcedReference.translator(model)`, shared by its variants and both encoders."""
    reference = reference or ForcedReference.translator(model)
    dec, pad = session(decoder_graph), model.config.pad_token_id
    if encode is None:
        enc = session(encoder_graph)

        def encode(src_rows):
            ids, mask = pad_batch(src_rows, pad, left=False)
            return enc.run(None, {"input_ids": ids, "attention_mask": mask}), mask

    def graph_step(src_rows):
        cross, mask = encode(src_rows)
        return onnx_step(dec, cross_feeds(cross, mask), model.config.max_positions)

    alone = [forced_logits(graph_step([src]), tgt) for src, tgt in pairs]
    head = pairs[:BATCH_ROWS]  # sources and targets of different lengths: both sides padded
    batch = _batch_diff(graph_step([s for s, _ in head]), [t for _, t in head], alone[:BATCH_ROWS], pad)
    rows = ((reference(s, t), a, np.asarray(t[1:])) for a, (s, t) in zip(alone, pairs))
    return quality_figures(rows, sample, batch, variant)


# ---- translation --------------------------------------------------------------------------------


def translator_parity(
    model,
    encoder_graph: Path,
    decoder_graph: Path,
    sources: Sequence[Sequence[int]],
    variant: str = "fp32",
    n_new: int = GREEDY_NEW_TOKENS,
    reference: list[list[int]] | None = None,
) -> dict:
    """Encoder + decoder graphs vs `Translator.encode/decode`, greedy tokens vs `greedy_decode`.

    reference: `reference_translations(model, sources, n_new)` when already computed (variants)."""
    cfg = model.config
    src, src_mask = pad_batch(sources, cfg.pad_token_id, left=False)
    cross = session(encoder_graph).run(None, {"input_ids": src, "attention_mask": src_mask})
    with torch.no_grad():
        ref_cross = model.encode(torch.from_numpy(src), torch.from_numpy(src_mask))
    valid = src_mask.astype(bool)[:, None, :, None]  # (B, 1, S, 1): padded source slots are never attended
    cross_diff = max(
        float(np.abs(np.where(valid, r.numpy() - c.astype(np.float32), 0)).max())
        for r, c in zip([t for kv in ref_cross for t in kv], cross)
    )
    got = onnx_step(session(decoder_graph), cross_feeds(cross, src_mask), cfg.max_positions)
    ref = torch_step(lambda i, m, p, past: model.decode(i, m, p, past, ref_cross, torch.from_numpy(src_mask)))
    start_id = cfg.decoder_start_token_id
    prompts = [[start_id, *s[: i + 1]] for i, s in enumerate(sources)]  # target prefixes, lengths differ
    figures: dict[str, Any] = {
        "cross_kv_max_abs_diff": cross_diff,
        **logits_parity(ref, got, prompts, cfg.pad_token_id, cfg.vocab_size),
    }
    _check_logits(figures, variant, "translator decoder logits")
    cross_limit = VARIANT_LIMITS[variant][1]
    if cross_limit is not None and cross_diff > cross_limit:
        _fail(f"{variant} translator encoder cross K/V max abs diff", cross_diff, cross_limit)
    reference = reference or reference_translations(model, sources, n_new)
    start = np.full((len(sources), 1), start_id, np.int64)
    tokens = greedy_loop(got, start, np.ones_like(start), np.zeros_like(start), n_new)
    figures.update(compare_tokens(reference, tokens, VARIANT_LIMITS[variant][2], f"{variant} translator greedy"))
    return figures


def cross_feeds(cross: Sequence[np.ndarray], source_mask: np.ndarray) -> dict[str, np.ndarray]:
    """A translator decoder's inputs from its encoder: the cross K/V (one (B, H, S, D) array per
    layer's key, then value) and the source mask (B, S)."""
    names = [f"cross_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}" for i in range(len(cross))]
    return {"encoder_attention_mask": source_mask, **dict(zip(names, cross))}


def reference_translations(model, sources: Sequence[Sequence[int]], n_new: int = GREEDY_NEW_TOKENS) -> list[list[int]]:
    """`greedy_decode` per source, EOS stopping disabled (eos id -1) so every row has n_new tokens."""
    original, device = model.config, next(model.parameters()).device
    model.config = dataclasses.replace(original, eos_token_id=-1)
    try:
        return [
            model.greedy_decode(
                torch.tensor([s], device=device), torch.ones(1, len(s), dtype=torch.long, device=device), n_new
            )[0]
            for s in sources
        ]
    finally:
        model.config = original
