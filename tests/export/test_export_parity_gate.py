"""The parity gate refuses what it must, beyond the encoder and decoder cases of test_export_tiny.py.

- A translator whose graphs do not compute what its PyTorch model computes (the model changed after
  export, in the encoder or in the decoder) is refused; the same graphs of the unchanged model pass.
- Greedy tokens that leave the PyTorch reference are refused for an exact variant even when every
  logit is within its limit, and recorded (not refused) for a reduced-precision one. The reference
  is drifted at one known token (sequence 1, new token 5): a drift that small cannot be made
  reliably from weights, and the gate must catch exactly it.
"""

from __future__ import annotations

import pytest
import torch

from export.gate import parity
from export.onnx.graphs import export_decoder, export_translator
from export.tiny import byte_tokenizer, tiny_model

N_NEW = 16
DRIFT = r"sequence 1 differs from the PyTorch reference at new token 5"


@pytest.fixture
def translator(tmp_path):
    tok = byte_tokenizer("translation")
    model = tiny_model("translation", tok.get_vocab_size()).eval()
    export_translator(model, tmp_path / "encoder.onnx", tmp_path / "decoder.onnx")
    sources = [tok.encode(t).ids for t in ("hello there", "a longer source sentence to translate")]
    return model, tmp_path / "encoder.onnx", tmp_path / "decoder.onnx", sources


@pytest.fixture
def generator(tmp_path):
    tok = byte_tokenizer("generation")
    model = tiny_model("generation", tok.get_vocab_size()).eval()
    export_decoder(model, tmp_path / "decoder.onnx")
    prompts = [tok.encode(t).ids for t in ("hello", "a longer prompt here")]
    return model, tmp_path / "decoder.onnx", prompts


def drifted(reference: list[list[int]], vocab: int) -> list[list[int]]:
    out = [list(r) for r in reference]
    out[1][5] = (out[1][5] + 1) % vocab
    return out


def test_gate_passes_the_translator_it_exported(translator):
    model, encoder, decoder, sources = translator
    figures = parity.translator_parity(model, encoder, decoder, sources, n_new=N_NEW)
    assert figures["greedy_identical"] and figures["cross_kv_max_abs_diff"] <= parity.LOGITS_MAX_ABS


@pytest.mark.parametrize("part", ["encoder_layers", "decoder_layers"])
def test_gate_refuses_a_wrong_translator_graph(translator, part):
    model, encoder, decoder, sources = translator
    with torch.no_grad():
        getattr(model, part)[-1].ln_ffn.bias.add_(torch.linspace(-0.1, 0.1, model.config.d_model))  # graph != model
    with pytest.raises(parity.ParityError, match="translator"):
        parity.translator_parity(model, encoder, decoder, sources, n_new=N_NEW)


def test_gate_refuses_a_greedy_token_mismatch_of_a_generator(generator):
    model, graph, prompts = generator
    wrong = drifted(parity.reference_generations(model, prompts, N_NEW), model.config.vocab_size)
    with pytest.raises(parity.ParityError, match=DRIFT):
        parity.decoder_parity(model, graph, prompts, n_new=N_NEW, reference=wrong)
    figures = parity.decoder_parity(model, graph, prompts, "fp16", n_new=N_NEW, reference=wrong)
    assert figures["prefill_max_abs_diff"] <= parity.LOGITS_MAX_ABS  # the logits alone would pass
    assert not figures["greedy_identical"] and figures["greedy_prefix_agreement"] == (1 + 5 / N_NEW) / 2


def test_gate_refuses_a_greedy_token_mismatch_of_a_translator(translator):
    model, encoder, decoder, sources = translator
    wrong = drifted(parity.reference_translations(model, sources, N_NEW), model.config.vocab_size)
    with pytest.raises(parity.ParityError, match=DRIFT):
        parity.translator_parity(model, encoder, decoder, sources, n_new=N_NEW, reference=wrong)
    figures = parity.translator_parity(model, encoder, decoder, sources, "fp16", n_new=N_NEW, reference=wrong)
    assert figures["decode_max_abs_diff"] <= parity.LOGITS_MAX_ABS  # the logits alone would pass
    assert not figures["greedy_identical"] and figures["greedy_prefix_agreement"] == (1 + 5 / N_NEW) / 2
