"""The parity gate's GPU measures (export/gate/gpu_gate.py) run on the CPU here: the same code, with
PyTorch fp16 and onnxruntime's CPU provider, so a mistake in it shows without a GPU; and
`--device` resolves to the CPU (or fails plainly) where PyTorch sees no GPU. On a GPU host the
last test builds a tiny model with `--device cuda` and finds the CUDA figures in its manifest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from export.gate import gpu_gate, parity
from export.onnx import graphs as ox
from export.tiny import tiny_model
from tests.paths import ROOT

PROMPTS = [[5, 9, 14, 3, 22], [7, 8], [30, 31, 32]]
TOKEN_FIGURES = {
    "prefill_max_abs_diff",
    "decode_max_abs_diff",
    "greedy_prefix_agreement",
    "greedy_prefix_agreement_vs_fp32",
    "device",
}


def _fp16(tmp_path: Path, export, name: str, keep_io_types: bool = False) -> dict[str, Path]:
    fp32 = {role: tmp_path / f"{role}.onnx" for role in name.split(",")}
    export(*fp32.values())
    out = {role: tmp_path / f"{role}.fp16.onnx" for role in fp32}
    for role in fp32:
        ox.make_fp16(fp32[role], out[role], keep_io_types=keep_io_types)
    return out


def test_decoder_figures_on_the_cpu(tmp_path):
    model = tiny_model("generation", 64)
    graph = _fp16(tmp_path, lambda p: ox.export_decoder(model, p), "decoder")["decoder"]
    fp32_reference = parity.reference_generations(model, PROMPTS, 8)
    figures = gpu_gate.decoder_figures(model, graph, PROMPTS, fp32_reference, n_new=8, device="cpu")
    assert figures.keys() >= TOKEN_FIGURES and figures["greedy_new_tokens"] == 8
    assert figures["prefill_max_abs_diff"] < 0.5
    # The agreement measure on two known cases: the fp32 graph makes PyTorch fp32's tokens (what the CPU
    # gate holds it to), and tokens no graph can make (ids past the vocabulary) agree nowhere.
    exact = gpu_gate.decoder_figures(model, tmp_path / "decoder.onnx", PROMPTS, fp32_reference, n_new=8, device="cpu")
    assert exact["greedy_prefix_agreement_vs_fp32"] == 1.0
    never = [[model.config.vocab_size] * 8 for _ in PROMPTS]
    assert (
        gpu_gate.decoder_figures(model, graph, PROMPTS, never, n_new=8, device="cpu")["greedy_prefix_agreement_vs_fp32"]
        == 0.0
    )


def test_translator_figures_on_the_cpu(tmp_path):
    model = tiny_model("translation", 64)
    graphs = _fp16(tmp_path, lambda e, d: ox.export_translator(model, e, d), "encoder,decoder")
    fp32_reference = parity.reference_translations(model, PROMPTS, 8)
    figures = gpu_gate.translator_figures(
        model, graphs["encoder"], graphs["decoder"], PROMPTS, fp32_reference, n_new=8, device="cpu"
    )
    assert figures.keys() >= TOKEN_FIGURES and figures["greedy_sequences"] == len(PROMPTS)
    assert figures["prefill_max_abs_diff"] < 0.5
    exact = gpu_gate.translator_figures(
        model, tmp_path / "encoder.onnx", tmp_path / "decoder.onnx", PROMPTS, fp32_reference, n_new=8, device="cpu"
    )
    assert exact["greedy_prefix_agreement_vs_fp32"] == 1.0  # the fp32 graphs make PyTorch fp32's tokens
    never = [[model.config.vocab_size] * 8 for _ in PROMPTS]
    assert (
        gpu_gate.translator_figures(model, graphs["encoder"], graphs["decoder"], PROMPTS, never, n_new=8, device="cpu")[
            "greedy_prefix_agreement_vs_fp32"
        ]
        == 0.0
    )


def test_encoder_figures_hold_the_fp16_cosine_limit_on_the_cpu(tmp_path):
    model = tiny_model("embedding", 64)
    graph = _fp16(tmp_path, lambda p: ox.export_encoder(model, p), "encoder", keep_io_types=True)["encoder"]
    figures = gpu_gate.encoder_figures(model, graph, [PROMPTS, PROMPTS[:1]], 0, device="cpu")
    assert figures["cos_min"] >= parity.VARIANT_LIMITS["fp16"][0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="PyTorch sees a GPU here")
def test_device_resolves_to_the_cpu_and_cuda_fails_plainly_without_a_gpu(tmp_path):
    assert gpu_gate.resolve_device("auto") == "cpu" and gpu_gate.resolve_device("cpu") == "cpu"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "tiny",
            "--kind",
            "embedding",
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "m"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "PyTorch sees no CUDA GPU" in proc.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU for PyTorch")
def test_a_cuda_build_records_the_fp16_graphs_figures_on_the_gpu(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "tiny",
            "--kind",
            "generation",
            "--device",
            "cuda",
            "--variants",
            "fp16",
            "--out",
            str(tmp_path / "m"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    graphs = json.loads((tmp_path / "m" / "model.json").read_text())["graphs"]
    cuda = next(g for g in graphs if g["variant"] == "fp16")["parity"]["cuda"]
    assert "skipped" in cuda or cuda.keys() >= TOKEN_FIGURES
