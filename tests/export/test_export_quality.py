"""The quality gate for reduced-precision variants (export/gate/parity.py) and the served variant it
decides (service/runtime.py): int8 decoders are judged teacher-forced against PyTorch, on the
trained checkpoints' own held-out data, and served by default on the CPU only when they pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from export.gate import parity
from export.train import data
from export.train.checkpoint import build_checkpoint, load_checkpoint
from export.train.evaluate import perplexity
from export.train.heldout import HELDOUT_FILE, heldout_sample
from service.manifest import load_model_dir
from service.runtime import Runtime
from service.settings import Settings
from tests.paths import ROOT

GENERATOR = ROOT / "checkpoints" / "tinystories-gpt"
TRANSLATOR = ROOT / "checkpoints" / "tatoeba-en-fr"
# docs/model-directory.md's quality limits, written out here so a change to the gate's table shows
DOCUMENTED_LIMITS = {"perplexity_ratio_max": 1.01, "top1_agreement_min": 0.95, "batch_max_abs_diff": 1e-4}


def test_identical_logits_pass_and_scrambled_logits_fail():
    rng = np.random.default_rng(0)
    rows = [(rng.normal(size=(20, 50)), rng.integers(0, 50, 20)) for _ in range(5)]
    same = parity.quality_figures(((x, x.copy(), t) for x, t in rows), "random", 0.0)
    q = same["quality"]
    assert same["quality_ok"] and q["tokens"] == 100
    assert q["perplexity_ratio"] == 1.0 and q["top1_agreement"] == 1.0 and q["kl_mean"] == 0.0
    # A variant whose logits are the reference's with a little noise: close but not equal.
    noisy = parity.quality_figures(((x, x + rng.normal(scale=0.05, size=x.shape), t) for x, t in rows), "noisy", 0.0)
    assert 0 < noisy["quality"]["kl_mean"] < 0.01 and noisy["quality"]["top1_agreement"] > 0.9
    # Logits of another position: the most likely token and the perplexity move; the gate says no.
    shifted = parity.quality_figures(((x, np.roll(x, 1, axis=0), t) for x, t in rows), "shifted", 0.0)
    assert not shifted["quality_ok"] and shifted["quality"]["top1_agreement"] < 0.5
    # Equal quality, but a row that moves with its batch: refused too.
    moving = parity.quality_figures(((x, x.copy(), t) for x, t in rows), "batch-dependent", 0.35)
    assert not moving["quality_ok"] and moving["quality"]["batch_max_abs_diff"] == 0.35


def test_fp16_rows_may_move_by_a_float16_rounding_between_batches_and_no_more():
    """Another batch shape sums in another order, each order rounded to float16: an fp16 row one ulp
    apart at its largest logit is the same row; int8 and exact variants keep the absolute 1e-4, and a
    row that reads its neighbours (0.35) fails for every variant."""
    rng = np.random.default_rng(1)
    rows = [(rng.normal(scale=4.0, size=(20, 50)) + 9.0, rng.integers(0, 50, 20)) for _ in range(3)]
    peak = max(float(np.abs(x).max()) for x, _ in rows)
    ulp = float(np.spacing(np.float16(peak)))
    assert parity.batch_limit("fp16", peak) == 2 * ulp and parity.batch_limit("int8", peak) == parity.LOGITS_MAX_ABS

    def judged(variant: str, moved: float) -> bool:
        return parity.quality_figures(((x, x.copy(), t) for x, t in rows), "moved", moved, variant)["quality_ok"]

    assert judged("fp16", ulp) and judged("fp16", 2 * ulp) and not judged("fp16", 3 * ulp)
    assert not judged("int8", ulp) and not judged("fp16", 0.35)


def test_int8_generator_keeps_heldout_perplexity(trained_generator_dir):
    m = load_model_dir(trained_generator_dir).manifest
    figures = m.graph("decoder", "int8").parity
    q = figures["quality"]
    assert "held-out stories" in q["sample"] and q["tokens"] >= 4096
    # The PyTorch perplexity on that sample, recomputed by the training code's own evaluation.
    model, meta = load_checkpoint(GENERATOR)
    _, windows = heldout_sample(meta, model.config, Tokenizer.from_file(str(GENERATOR / "tokenizer.json")), GENERATOR)
    pairs = [(torch.tensor([w[:-1]]), torch.tensor([w[1:]])) for w in windows]
    assert perplexity(model, pairs)["perplexity"] == pytest.approx(q["perplexity_pytorch"], rel=1e-4)
    assert q["perplexity_ratio"] <= parity.QUALITY_LIMITS["perplexity_ratio_max"]
    assert q["top1_agreement"] >= parity.QUALITY_LIMITS["top1_agreement_min"]
    assert figures["quality_ok"] and q["batch_max_abs_diff"] == 0.0
    assert "quality" not in m.graph("decoder", "optimized").parity  # exact variants are held to tokens
    runtime = Runtime(Settings.from_env(env={}, device="cpu"))
    try:  # the fastest, by the export's timings, of the variants the gate admitted (int8 among them)
        timed = m.parity["speed"]["step_us"]
        admitted = ["fp32", "optimized"] + [v for v in ("int8", "int4") if m.graph("decoder", v).parity["quality_ok"]]
        assert "int8" in admitted and runtime.choose_variant(m, "decoder") == min(admitted, key=timed.get)
    finally:
        runtime.close()


def test_int8_translator_is_judged_on_test_pairs(tmp_path):
    if not (TRANSLATOR / "model.safetensors").is_file():
        pytest.skip("the trained translator checkpoint is not here")
    m = build_checkpoint(TRANSLATOR, tmp_path / "t", ("optimized", "int8")).manifest  # as `make models`
    limits = parity.QUALITY_LIMITS
    within = []
    for role in ("encoder", "decoder"):
        figures = m.graph(role, "int8").parity
        q = figures["quality"]
        assert "test pairs" in q["sample"] and q["tokens"] > 1000
        assert q["perplexity_ratio"] <= limits["perplexity_ratio_max"]
        assert q["top1_agreement"] >= limits["top1_agreement_min"]
        assert figures["quality_ok"] == (q["batch_max_abs_diff"] <= limits["batch_max_abs_diff"])
        within.append(
            q["perplexity_ratio"] <= DOCUMENTED_LIMITS["perplexity_ratio_max"]
            and q["top1_agreement"] >= DOCUMENTED_LIMITS["top1_agreement_min"]
            and q["batch_max_abs_diff"] <= DOCUMENTED_LIMITS["batch_max_abs_diff"]
        )
    # each target row attends over its own KV slots (GroupQueryAttention): the same alone and batched
    assert m.graph("decoder", "int8").parity["quality"]["batch_max_abs_diff"] == 0.0
    assert within[1]
    runtime = Runtime(Settings.from_env(env={}, device="cpu"))
    try:  # without export timings for translators, auto serves a quantised variant the gate admitted
        assert runtime.choose_variant(m, "decoder") == "int8"
    finally:
        runtime.close()


@pytest.mark.parametrize("checkpoint", [GENERATOR, TRANSLATOR], ids=["generator", "translator"])
def test_the_shipped_heldout_sample_is_the_training_split(checkpoint):
    """heldout.jsonl (in the repository, so containers and fresh clones judge on the same text)
    holds exactly the held-out data of the training split, none of the training data."""
    kind = "generator" if checkpoint == GENERATOR else "translator"
    if not (checkpoint / HELDOUT_FILE).is_file() or not data.DEFAULT_DATA[kind].is_file():
        pytest.skip("the checkpoint's heldout.jsonl or the training corpus is not here")
    model, meta = load_checkpoint(checkpoint)
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    shipped = heldout_sample(meta, model.config, tok, checkpoint)
    from_corpus = heldout_sample(meta, model.config, tok)
    assert shipped[1] == from_corpus[1] and len(shipped[1]) == (32 if kind == "generator" else 512)
    items = [json.loads(line) for line in (checkpoint / HELDOUT_FILE).read_text(encoding="utf-8").splitlines()]
    if kind == "translator":
        train = {en for en, _ in data.split_tatoeba(data.load_tatoeba(data.DEFAULT_DATA[kind])).train}
        assert not any(item["source"] in train for item in items)
    else:
        train = set(data.split_stories(data.load_stories(data.DEFAULT_DATA[kind]))[0])
        assert not any(item["text"] in train for item in items)


def test_embedding_int8_is_rowwise_batch_invariant_and_judged(tiny_models_root, tmp_path):
    """An encoder's int8 graph is row-wise: a text's vector is the same alone and batched; the gate
    records its quality; onnxruntime's per-tensor dynamic int8, which moves a row with its batch, fails it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from export.tiny import byte_tokenizer, tiny_model

    d = tiny_models_root / "tiny-embed"
    manifest = json.loads((d / "model.json").read_text())
    int8 = next(g for g in manifest["graphs"] if g["variant"] == "int8")
    quality = int8["parity"]["quality"]
    assert int8["parity"]["int8_method"] == "rowwise" and quality["batch_max_abs_diff"] <= 1e-4
    assert {"cos_min", "cos_mean", "similarity_spearman"} <= set(quality)

    sess = parity.session(d / int8["file"])
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    seqs = [tok.encode(t).ids for t in ("a b", "the longest of the three texts here", "short one")]
    ids, mask = parity.pad_batch(seqs, manifest["special_tokens"]["pad"], left=False)
    batched = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    for row, seq in enumerate(seqs):
        one, one_mask = parity.pad_batch([seq], manifest["special_tokens"]["pad"], left=False)
        alone = sess.run(None, {"input_ids": one, "attention_mask": one_mask})[0]
        np.testing.assert_allclose(alone[0], batched[row], atol=1e-6)

    torch.manual_seed(0)
    model = tiny_model("embedding", byte_tokenizer("embedding").get_vocab_size()).eval()
    from export.onnx import graphs

    graphs.export_encoder(model, tmp_path / "fp32.onnx")
    quantize_dynamic(str(tmp_path / "fp32.onnx"), str(tmp_path / "dyn.onnx"), weight_type=QuantType.QInt8)
    texts = [" ".join(["word"] * n) for n in range(1, 10)]  # byte tokens: at most 44, the limit is 48
    sample = [byte_tokenizer("embedding").encode(t).ids for t in texts]
    pad = byte_tokenizer("embedding").token_to_id("[PAD]")
    dynamic = parity.encoder_quality(model, tmp_path / "dyn.onnx", sample, "words", pad)
    assert not dynamic["quality_ok"] and dynamic["quality"]["batch_max_abs_diff"] > 1e-4
    graphs.make_int8(tmp_path / "fp32.onnx", tmp_path / "rowwise.onnx")
    rowwise = parity.encoder_quality(model, tmp_path / "rowwise.onnx", sample, "words", pad)
    assert rowwise["quality"]["batch_max_abs_diff"] <= 1e-4
