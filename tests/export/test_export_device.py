"""The PyTorch models run on their input's device: every mask and index they build follows it.

Without a GPU, the "meta" device stands in for CUDA: a meta tensor has a shape and a device but
no data, and any op mixing it with a CPU tensor fails ("expected ... same device"), just as a
CPU-built mask fails beside CUDA activations. The GPU tests at the end run the real thing (the
shipped checkpoints' greedy tokens on CUDA equal the CPU's; `python -m export train --device cuda`)
and skip cleanly without one.
"""

from __future__ import annotations

import json

import pytest
import torch

from export.models.decoder import DecoderConfig, GPTDecoder
from export.models.encoder import EncoderConfig, SentenceEncoder
from export.models.layers import causal_mask, padding_mask
from export.models.seq2seq import Seq2SeqConfig, Translator
from export.train.checkpoint import load_checkpoint
from tests.paths import CHECKPOINTS

META = torch.device("meta")
B, T, P = 2, 5, 3
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU for PyTorch")


def _models():
    dec = DecoderConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_positions=32)
    enc = EncoderConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_positions=32, max_length=16)
    s2s = Seq2SeqConfig(
        vocab_size=64, d_model=16, n_encoder_layers=1, n_decoder_layers=1, n_heads=2, d_ff=32, max_positions=32
    )
    return GPTDecoder(dec), SentenceEncoder(enc), Translator(s2s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mask_builders_return_tensors_on_the_inputs_device(dtype):
    attention = torch.ones(B, P + T, dtype=torch.long, device=META)
    causal, padding = causal_mask(attention, T, dtype), padding_mask(attention, dtype)
    assert (causal.device, causal.shape, causal.dtype) == (META, (B, 1, T, P + T), dtype)
    assert (padding.device, padding.shape, padding.dtype) == (META, (B, 1, 1, P + T), dtype)


def test_mask_builders_on_the_cpu_keep_their_values():
    attention = torch.tensor([[0, 1, 1], [1, 1, 1]])
    mask = causal_mask(attention, 2, torch.float32)  # (2, 1, 2, 3): queries at slots 1 and 2
    low = torch.finfo(torch.float32).min
    assert mask.device.type == "cpu"
    assert mask[0, 0].tolist() == [[low, 0.0, low], [low, 0.0, 0.0]]
    assert mask[1, 0].tolist() == [[0.0, 0.0, low], [0.0, 0.0, 0.0]]


def test_models_run_forward_on_the_meta_device():
    with META:
        gpt, encoder, translator = _models()
    ids = torch.zeros(B, T, dtype=torch.long, device=META)
    past = [(torch.zeros(B, 2, P, 8, device=META),) * 2 for _ in range(2)]
    logits, present = gpt(ids, past=past)  # builds its own attention mask and positions
    assert (logits.device, logits.shape, present[0][0].shape) == (META, (B, T, 64), (B, 2, P + T, 8))
    assert encoder(ids, torch.ones_like(ids)).shape == (B, 16)
    cross = translator.encode(ids, torch.ones_like(ids))
    assert translator(ids, torch.ones_like(ids), ids, torch.ones_like(ids)).device == META
    logits, _ = translator.decode(
        ids[:, :1],
        torch.ones(B, 1, dtype=torch.long, device=META),
        torch.zeros(B, 1, dtype=torch.long, device=META),
        None,
        cross,
        torch.ones_like(ids),
    )
    assert logits.shape == (B, 1, 64)


@pytest.mark.gpu
@needs_cuda
def test_shipped_checkpoints_on_cuda_give_the_cpus_greedy_tokens():
    """Trained weights (decisive logits, unlike random ones): the same greedy tokens on both devices."""
    gpt, _ = load_checkpoint(CHECKPOINTS / "tinystories-gpt")
    prompt = torch.tensor([[gpt.config.eos_token_id, 400, 280, 259]])  # (1, T)
    on_cpu = gpt.generate(prompt, 24, stop_at_eos=False)
    on_gpu = gpt.to("cuda").generate(prompt.cuda(), 24, stop_at_eos=False)
    assert on_gpu.device.type == "cuda" and on_gpu.cpu().tolist() == on_cpu.tolist()
    translator, _ = load_checkpoint(CHECKPOINTS / "tatoeba-en-fr")
    src = torch.tensor([[5, 60, 70, 80, translator.config.eos_token_id]])  # (1, S)
    on_cpu = translator.greedy_decode(src, torch.ones_like(src), 24)
    assert translator.to("cuda").greedy_decode(src.cuda(), torch.ones_like(src).cuda(), 24) == on_cpu


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind", ["translator", "generator"])
def test_training_runs_on_cuda(tmp_path, kind):
    from tests.export.test_train import run_cli

    _, out = run_cli(kind, tmp_path, "--steps", "6", "--eval-every", "3", "--device", "cuda")
    assert json.loads((out / "config.json").read_text())["training"]["device"] == "cuda"
