"""`python -m export convert` on a Marian (OPUS-MT layout) folder: a translation model.

The folder is built here, offline, as OPUS-MT ships one: two SentencePiece unigram models trained
in code on the repository's held-out Tatoeba pairs (source.spm on English, target.spm on French,
so French accents are unknown to the source model but present in the joint vocab.json), vocab.json
joining both (`</s>` 0, `<unk>` 1, a `>>fr<<` language code, `<pad>` last), a tiny MarianConfig
(post-LN, swish, scaled embeddings, decoder start = pad), random weights (std 0.3, embeddings
0.6, so greedy outputs differ between sources), a random `final_logits_bias`, OPUS-MT's
generation settings (bad_words_ids [[pad]], forced EOS, 4 beams) and MarianTokenizer's own save.
The converted directory is served by a real server: Translate's greedy texts equal transformers'
`generate(num_beams=1)` decoded by MarianTokenizer, beam search runs, and the model directory's
tokenizer gives MarianTokenizer's ids and texts.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

from export.convert import ConversionError, convert
from export.convert.reference import TEXTS
from service.proto import inference_pb2 as pb
from tests.paths import ROOT

NAME = "opus-mt-tiny"
SOURCES = [
    "Hello world.",
    "The café is near the station, isn't it?",
    "Ça coûte 12,50 € — naïve résumé, déjà vu.",
    "Yes",
    "Tom didn't want to go to school today because he was sick.",
    "Où est la gare ? 東京 🙂",
]
MAX_LENGTH = 20


def pairs() -> list[dict]:
    lines = (ROOT / "checkpoints" / "tatoeba-en-fr" / "heldout.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def train_spm(texts: list[str], file: Path) -> list[str]:
    """A SentencePiece unigram model of about 400 pieces, written to file; -> its pieces by id."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=400,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    file.write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def build_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rows = pairs()
    source = train_spm([r["source"] for r in rows], folder / "source.spm")
    target = train_spm([ref for r in rows for ref in r["references"]], folder / "target.spm")
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in source + target:
        if piece not in ("<s>", "</s>", "<unk>"):
            vocab.setdefault(piece, len(vocab))
    vocab[">>fr<<"] = len(vocab)  # a target-language code, as multilingual OPUS-MT vocabularies have
    vocab["<pad>"] = pad = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        architectures=["MarianMTModel"],
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.6 if name == "model.shared.weight" else 0.3)
            elif name.endswith("bias"):
                torch.nn.init.normal_(p, std=0.1)
        torch.nn.init.normal_(model.final_logits_bias, std=0.1)
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]],
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        pad_token_id=pad,
        max_length=512,
        num_beams=4,
    )
    model.save_pretrained(folder)
    MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json")).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return build_folder(tmp_path_factory.mktemp("hf") / NAME)


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("converted")
    convert(folder, root / NAME, name=NAME)
    return root


def transformers_translations(folder: Path, sources: list[str]) -> list[str]:
    """Greedy, MAX_LENGTH tokens at most; one token more generated so that the forced EOS (which
    replaces the last token) falls outside, as the service does not force one."""
    tok = MarianTokenizer.from_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder).eval()
    texts = []
    for source in sources:
        with torch.no_grad():
            out = model.generate(
                **tok([source], return_tensors="pt"), max_new_tokens=MAX_LENGTH + 1, num_beams=1, do_sample=False
            )
        texts.append(tok.decode(out[0, 1 : MAX_LENGTH + 1], skip_special_tokens=True))
    return texts


async def test_translate_greedy_matches_transformers_and_beams_run(folder, converted, start_server):
    server = await start_server(converted)
    greedy = await server.translation.Translate(
        pb.TranslateRequest(inputs=SOURCES, model=NAME, beam_size=1, max_length=MAX_LENGTH)
    )
    expected = transformers_translations(folder, SOURCES)
    assert [t.text for t in greedy.translations] == expected
    assert len(set(expected)) > len(expected) // 2  # outputs depend on the source
    beams = await server.translation.Translate(
        pb.TranslateRequest(inputs=SOURCES, model=NAME, beam_size=4, max_length=MAX_LENGTH)
    )
    assert len(beams.translations) == len(SOURCES) and all(t.text for t in beams.translations)


def test_tokenizer_gives_marian_tokenizers_ids_and_texts(folder, converted):
    tok = Tokenizer.from_file(str(converted / NAME / "tokenizer.json"))
    ref = MarianTokenizer.from_pretrained(folder)
    rows, rng = pairs(), random.Random(0)
    french = [r for row in rows for r in row["references"]]  # accents source.spm does not know, alone and in runs
    crafted = ["x </s> y <unk>", "a  b ", "Ça", "été", "déçu", "réécrire", ">>fr<< Hello world."]
    mixed = "ab eéèçàùâêœÇÉ東京Привет,.!?'\t\n-ßü🙂"  # noqa: RUF001 - Cyrillic on purpose
    noise = ["".join(rng.choice(mixed) for _ in range(rng.randrange(1, 24))) for _ in range(300)]
    for text in [*TEXTS, *SOURCES, *(r["source"] for r in rows), *french, *crafted, *noise]:
        assert tok.encode(text).ids == ref(text)["input_ids"], text
    for _ in range(500):  # any target ids, special ones included
        ids = [rng.randrange(tok.get_vocab_size()) for _ in range(rng.randrange(1, 12))]
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True), ids


def test_manifest_says_what_was_converted(converted, folder):
    manifest = json.loads((converted / NAME / "model.json").read_text())
    arch, pad = manifest["architecture"], json.loads((folder / "config.json").read_text())["pad_token_id"]
    assert (arch["norm_position"], arch["positions"], arch["activation"]) == ("post", "marian", "swish")
    assert not arch["final_norms"] and arch["final_logits_bias"] and arch["scale_embedding"]
    assert manifest["special_tokens"] == {"pad": pad, "eos": 0, "unk": 1, "decoder_start": pad}
    source = manifest["extra"]["converted_from"]
    assert source["banned_tokens"] == [pad] and source["tokenizer"]["source_pieces_not_in_vocab"] == 0
    assert source["reference"]["translation"]["greedy_tokens_equal"] > 0


def copy_with(folder: Path, dst: Path, file: str, **changes) -> Path:
    shutil.copytree(folder, dst)
    data = json.loads((dst / file).read_text())
    (dst / file).write_text(json.dumps({**data, **changes}))
    return dst


@pytest.mark.parametrize(
    "file, changes, field",
    [
        ("config.json", {"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings"),
        ("config.json", {"activation_function": "mish"}, "activation_function"),
        ("config.json", {"normalize_before": True}, "normalize_before"),
        ("config.json", {"static_position_embeddings": False}, "static_position_embeddings"),
        ("config.json", {"add_bias_logits": True}, "add_bias_logits"),
        ("config.json", {"decoder_ffn_dim": 128}, "decoder_ffn_dim"),
        ("tokenizer_config.json", {"separate_vocabs": True}, "separate_vocabs"),
        ("generation_config.json", {"no_repeat_ngram_size": 3}, "no_repeat_ngram_size"),
    ],
)
def test_unsupported_folders_are_refused_naming_the_field(file, changes, field, folder, tmp_path):
    copy = copy_with(folder, tmp_path / NAME, file, **changes)
    with pytest.raises(ConversionError, match=field):
        convert(copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()
