"""Training scripts on tiny models: tokenizers round-trip, the grouped split holds, loss goes down,
checkpoints round-trip, resume continues from the same step with the same state, beam 1 = greedy.

Uses the small corpus samples in tests/data/train/ (not ../shared/data) and 1 torch thread.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from export.models.seq2seq import Seq2SeqConfig, Translator
from export.train import data, evaluate, loop, tokenizer_train
from export.train.checkpoint import load_checkpoint, save_checkpoint
from tests.paths import DATA

SAMPLES = DATA / "train"
TATOEBA = SAMPLES / "tatoeba-eng-fra.sample.tsv"
STORIES = SAMPLES / "tinystories.sample.txt"
FRENCH = [
    "Va !",
    "Qu'est-ce que c'est ?",
    "Je n’ai pas le temps : désolé.",  # noqa: RUF001 - a typographic apostrophe on purpose
    "Où êtes-vous allés, Ève et Noël ?",
    "C'est l'été\u202f! Ça va\u00a0?",
    "«\u00a0Bonjour\u00a0», dit-il.",
    "Il  a deux espaces.",
]
TINY_TRANSLATOR = [
    "--d-model",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--d-ff",
    "64",
    "--vocab-size",
    "300",
    "--max-tokens",
    "400",
    "--warmup",
    "2",
    "--lr",
    "3e-3",
    "--split-test",
    "40",
    "--split-dev",
    "20",
    "--dev-sentences",
    "8",
    "--max-len",
    "32",
    "--threads",
    "1",
]
TINY_GENERATOR = [
    "--d-model",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--d-ff",
    "64",
    "--vocab-size",
    "300",
    "--max-tokens",
    "256",
    "--context",
    "32",
    "--warmup",
    "2",
    "--lr",
    "3e-3",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def fr_tokenizer():
    pairs = data.load_tatoeba(TATOEBA)
    texts = [t for en, fr in pairs for t in (en, fr)] + FRENCH
    return tokenizer_train.train_translator_tokenizer(texts, vocab_size=400)


def run_cli(kind: str, tmp: Path, *extra: str, name: str = "run") -> tuple[Path, Path]:
    run_dir, out = tmp / name, tmp / f"{name}-ckpt"
    corpus = TATOEBA if kind == "translator" else STORIES
    tiny = TINY_TRANSLATOR if kind == "translator" else TINY_GENERATOR
    argv = ["train", kind, "--data", str(corpus), "--run-dir", str(run_dir), "--out", str(out), *tiny, *extra]
    assert loop.main(argv) == 0
    return run_dir, out


def test_translator_tokenizer_round_trips_french(fr_tokenizer):
    for text in FRENCH:
        enc = fr_tokenizer.encode(text)
        assert enc.ids[-1] == 2  # </s> appended by the post-processor
        assert fr_tokenizer.decode(enc.ids, skip_special_tokens=True) == text
    assert [fr_tokenizer.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]


def test_generator_tokenizer_is_byte_level_with_endoftext():
    tok = tokenizer_train.train_generator_tokenizer(data.load_stories(STORIES), vocab_size=400)
    text = "Lily said, “Mom, look!” — it’s 3 o'clock.\nThe end."  # noqa: RUF001 - typographic quotes
    enc = tok.encode(text)
    assert enc.ids[0] == 0 and tok.id_to_token(0) == "<|endoftext|>"
    assert tok.decode(enc.ids, skip_special_tokens=True) == text


def test_tatoeba_split_is_grouped_by_english_sentence():
    pairs = [*data.load_tatoeba(TATOEBA), ("Go.", "Bouge !"), ("Go.", "Filez !")]
    split = data.split_tatoeba(pairs, seed=3, n_test=50, n_dev=20)
    train_en = {en for en, _ in split.train}
    test_en, dev_en = {en for en, _ in split.test}, {en for en, _ in split.dev}
    assert not (train_en & test_en) and not (train_en & dev_en) and not (test_en & dev_en)
    refs = dict(split.test + split.dev)
    for en, fr in pairs:  # every translation sits with its English sentence
        assert fr in refs[en] if en in refs else (en, fr) in split.train
    assert split.test == data.split_tatoeba(pairs, seed=3, n_test=50, n_dev=20).test


def test_token_batches_respect_budget_and_cover_every_example():
    lengths = [(i * 7) % 31 + 1 for i in range(500)]
    batches = data.token_batches(lengths, max_tokens=120, seed=0, epoch=1)
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert all(len(b) * max(lengths[i] for i in b) <= 120 for b in batches)


def tiny_translator() -> Translator:
    torch.manual_seed(0)
    return Translator(
        Seq2SeqConfig(
            vocab_size=50, d_model=32, n_encoder_layers=1, n_decoder_layers=2, n_heads=2, d_ff=64, dropout=0.0
        )
    )


def test_checkpoint_round_trip_gives_identical_logits(tmp_path, fr_tokenizer):
    model = tiny_translator().eval()
    tok_path = tmp_path / "tokenizer.json"
    fr_tokenizer.save(str(tok_path))
    src, mask = torch.randint(4, 50, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    tgt = torch.randint(4, 50, (2, 5))
    for fp16 in (False, True):
        out = save_checkpoint(
            model,
            tmp_path / f"ck{fp16}",
            name="t",
            tokenizer_path=tok_path,
            special_tokens={},
            max_length=32,
            fp16=fp16,
        )
        loaded, meta = load_checkpoint(out)
        if fp16:  # the loaded model is exactly the original with fp16-rounded weights
            model.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
        assert meta["architecture"] == "seq2seq" and (out / "tokenizer.json").read_bytes() == tok_path.read_bytes()
        with torch.no_grad():
            tgt_mask = torch.ones_like(tgt)
            assert torch.equal(loaded(src, mask, tgt, tgt_mask), model(src, mask, tgt, tgt_mask))


def test_beam_of_one_equals_greedy():
    model = tiny_translator().eval()
    src = torch.randint(4, 50, (3, 6))
    mask = torch.ones_like(src)
    mask[1, 4:] = 0
    assert evaluate.beam_search(model, src, mask, beam_size=1, max_length=12) == model.greedy_decode(src, mask, 12)
    beams = evaluate.beam_search(model, src, mask, beam_size=4, max_length=12)
    assert len(beams) == 3 and all(0 < len(b) <= 12 for b in beams)


def translator_loss(model, task_batch) -> float:
    with torch.no_grad():
        logits = model(task_batch["src_ids"], task_batch["src_mask"], task_batch["tgt_ids"], task_batch["tgt_mask"])
        return float(F.cross_entropy(logits.flatten(0, 1), task_batch["labels"].flatten(), ignore_index=-100))


def test_translator_training_lowers_loss(tmp_path):
    run_dir, out = run_cli("translator", tmp_path, "--steps", "40", "--eval-every", "20")
    trained, meta = load_checkpoint(out)
    args = loop.parse_args(["translator", "--data", str(TATOEBA), "--run-dir", str(run_dir), *TINY_TRANSLATOR])
    task = loop.TranslatorTask(args, run_dir)  # same seed: the untrained model the run started from
    batch, _ = task.next_batch(0)
    assert translator_loss(trained, batch) < translator_loss(task.model.eval(), batch) - 0.5
    assert meta["training"]["steps"] == 40 and meta["special_tokens"]["eos"] == 2
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [20, 40] and "dev_bleu" in records[-1]


@pytest.mark.parametrize("kind", ["translator", "generator"])
def test_resume_continues_from_the_same_step_and_state(tmp_path, kind):
    _, straight = run_cli(kind, tmp_path, "--steps", "12", "--eval-every", "6", name="straight")
    run_cli(kind, tmp_path, "--steps", "12", "--eval-every", "6", "--stop-at", "6", name="split")
    state = torch.load(tmp_path / "split" / "state.pt", weights_only=False)
    assert state["step"] == 6
    _, resumed = run_cli(kind, tmp_path, "--steps", "12", "--eval-every", "6", "--resume", name="split")
    a, _ = load_checkpoint(straight)
    b, meta = load_checkpoint(resumed)
    assert meta["training"]["steps"] == 12
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_generator_training_lowers_heldout_perplexity(tmp_path):
    run_dir, out = run_cli("generator", tmp_path, "--steps", "30", "--eval-every", "15")
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert records[-1]["heldout_ppl"] < records[0]["heldout_ppl"] < 300
    model, meta = load_checkpoint(out)
    assert meta["kind"] == "generation" and meta["special_tokens"] == {"bos": 0, "eos": 0, "pad": 0}
    assert model.config.max_positions == 32
