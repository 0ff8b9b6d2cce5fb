"""The parity gate on a CUDA GPU: the fp16 graphs on onnxruntime's CUDA provider against the
PyTorch model in fp16 on the same GPU, the pair the service on a GPU is compared with.

Runs beside the CPU gate (export/gate/parity.py), never instead of it. Builds call it for the fp16
variant when `--device` resolves to "cuda"; its figures go into the graph's manifest parity under
"cuda": encoder cosine (a miss fails the build), decoder logits and greedy tokens (recorded and
judged on quality, as fp16 on the CPU), and greedy agreement with the fp32 reference. Without the
CUDA provider the figures say so. Every function takes the device ("cpu" runs the same code in
the CPU test suite).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnxruntime as ort
import torch

from export.gate import parity

CUDA = "CUDAExecutionProvider"


def resolve_device(name: str) -> str:
    """auto -> "cuda" when PyTorch sees a CUDA GPU, else "cpu"; "cuda" without one is an error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: PyTorch sees no CUDA GPU (a CUDA build of torch and a driver are needed)")
    return name


def _session(path: Path, device: str) -> ort.InferenceSession | None:
    """A session on the device, or None for CUDA when this onnxruntime has no CUDA provider."""
    if device == "cuda" and CUDA not in ort.get_available_providers():
        return None
    wanted = CUDA if device == "cuda" else "CPUExecutionProvider"
    sess = ort.InferenceSession(str(path), providers=list(dict.fromkeys([wanted, "CPUExecutionProvider"])))
    if sess.get_providers()[0] != wanted:
        raise parity.ParityError(
            f"parity gate: onnxruntime could not run {path.name} on CUDA "
            f"(providers {sess.get_providers()}): CUDA/cuDNN libraries missing?"
        )
    return sess


M = TypeVar("M", bound=torch.nn.Module)


def _half(model: M, device: str) -> M:
    return copy.deepcopy(model).to(device, torch.float16).eval()


def _header(device: str) -> dict:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {"device": name, "pytorch": "fp16 on the same device", "onnxruntime": ort.__version__}


NO_CUDA_PROVIDER = {"skipped": "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)"}


def encoder_figures(
    model, graph: Path, batches: Sequence[Sequence[Sequence[int]]], pad_id: int, device: str = "cuda"
) -> dict:
    """fp16 encoder on CUDA vs PyTorch fp16 on CUDA: cosine (fp16 limit), max abs difference."""
    sess = _session(graph, device)
    if sess is None:
        return NO_CUDA_PROVIDER
    ref_model, cos, diff = _half(model, device), [], 0.0
    for batch in batches:
        ids, mask = parity.pad_batch(batch, pad_id, left=False)
        with torch.no_grad():
            ref = ref_model(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)).float().cpu().numpy()
        got = sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float32)
        cos.append(parity._cos(ref, got))
        diff = max(diff, float(np.abs(ref - got).max()))
    figures = {**_header(device), "cos_min": float(np.concatenate(cos).min()), "max_abs_diff": diff}
    limit = parity.VARIANT_LIMITS["fp16"][0]
    if figures["cos_min"] < limit:
        parity._fail("fp16 encoder on CUDA, cosine vs PyTorch fp16 on CUDA", figures["cos_min"], limit)
    return figures


def decoder_figures(
    model,
    graph: Path,
    prompts: Sequence[Sequence[int]],
    fp32_reference: list[list[int]],
    n_new: int = parity.GREEDY_NEW_TOKENS,
    device: str = "cuda",
) -> dict:
    """fp16 GPT decoder on CUDA vs `GPTDecoder` in fp16 on CUDA: logits and greedy tokens."""
    sess = _session(graph, device)
    if sess is None:
        return NO_CUDA_PROVIDER
    cfg, ref_model = model.config, _half(model, device)
    got = parity.onnx_step(sess, max_length=cfg.max_positions)
    figures = {
        **_header(device),
        **parity.logits_parity(
            parity.torch_step(ref_model, device, torch.float16), got, prompts, cfg.pad_token_id, cfg.vocab_size
        ),
    }
    ids, mask = parity.pad_batch(prompts, cfg.pad_token_id, left=True)
    tokens = parity.greedy_loop(got, ids, mask, parity.prompt_positions(mask), n_new)
    return _tokens(figures, parity.reference_generations(ref_model, prompts, n_new), fp32_reference, tokens)


def translator_figures(
    model,
    encoder_graph: Path,
    decoder_graph: Path,
    sources: Sequence[Sequence[int]],
    fp32_reference: list[list[int]],
    n_new: int = parity.GREEDY_NEW_TOKENS,
    device: str = "cuda",
) -> dict:
    """fp16 translator graphs on CUDA vs `Translator` in fp16 on CUDA: logits and greedy tokens."""
    enc, dec = _session(encoder_graph, device), _session(decoder_graph, device)
    if enc is None:
        return NO_CUDA_PROVIDER
    cfg, ref_model = model.config, _half(model, device)
    src, src_mask = parity.pad_batch(sources, cfg.pad_token_id, left=False)
    cross = enc.run(None, {"input_ids": src, "attention_mask": src_mask})
    got = parity.onnx_step(dec, parity.cross_feeds(cross, src_mask), cfg.max_positions)
    mask_t = torch.from_numpy(src_mask).to(device)
    with torch.no_grad():
        ref_cross = ref_model.encode(torch.from_numpy(src).to(device), mask_t)
    ref = parity.torch_step(
        lambda i, m, p, past: ref_model.decode(i, m, p, past, ref_cross, mask_t), device, torch.float16
    )
    prompts = [[cfg.decoder_start_token_id, *s[: i + 1]] for i, s in enumerate(sources)]  # as the CPU gate
    figures = {**_header(device), **parity.logits_parity(ref, got, prompts, cfg.pad_token_id, cfg.vocab_size)}
    start = np.full((len(sources), 1), cfg.decoder_start_token_id, np.int64)
    tokens = parity.greedy_loop(got, start, np.ones_like(start), np.zeros_like(start), n_new)
    return _tokens(figures, parity.reference_translations(ref_model, sources, n_new), fp32_reference, tokens)


def _tokens(figures: dict, fp16_reference, fp32_reference, tokens: np.ndarray) -> dict:
    figures.update(parity.compare_tokens(fp16_reference, tokens, False, "fp16 on CUDA greedy"))
    vs_fp32 = parity.compare_tokens(fp32_reference, tokens, False, "fp16 on CUDA greedy vs fp32")
    figures["greedy_prefix_agreement_vs_fp32"] = vs_fp32["greedy_prefix_agreement"]
    return figures
