"""Tokenizer training with the `tokenizers` library: `python -m export tokenizer generator|translator|mlm`.

- generator: byte-level BPE (GPT-2 style); `<|endoftext|>` (id 0) is bos = eos = pad and is
  prepended by the post-processor, as every training story follows that separator.
- translator: one joint English+French BPE over a Metaspace pre-tokenizer (SentencePiece style:
  everything but spaces kept as is, so decode(encode(x)) == x for seen characters); specials
  `<pad>`=0 `<s>`=1 `</s>`=2 `<unk>`=3 as `Seq2SeqConfig`; `</s>` appended to a source.
- mlm: BERT's uncased WordPiece, `[PAD]`=0 `[UNK]`=1 `[CLS]`=2 `[SEP]`=3 `[MASK]`=4, wrapped as
  `[CLS] $A [SEP]`; the specials are added tokens, so the literal text `[MASK]` encodes to id 4.
Every file carries its decoder: the service decodes with the plain `tokenizers` library.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from export.train import data

log = logging.getLogger(__name__)

ENDOFTEXT = "<|endoftext|>"
TRANSLATOR_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, as in Seq2SeqConfig
GENERATOR_SPECIAL_TOKENS = {"bos": 0, "eos": 0, "pad": 0}
TRANSLATOR_SPECIAL_TOKENS = {"pad": 0, "bos": 1, "eos": 2, "unk": 3, "decoder_start": 1}
MLM_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4
MLM_SPECIAL_TOKENS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def train_generator_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Byte-level BPE; id 0 is `<|endoftext|>`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{ENDOFTEXT} $A", pair=f"{ENDOFTEXT} $A {ENDOFTEXT} $B", special_tokens=[(ENDOFTEXT, 0)]
    )
    return tok


def train_translator_tokenizer(texts: Iterable[str], vocab_size: int = 8000) -> Tokenizer:
    """Joint English+French BPE over Metaspace; ids 0..3 are <pad> <s> </s> <unk>."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=TRANSLATOR_SPECIALS, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 2)]
    )
    for i, name in enumerate(TRANSLATOR_SPECIALS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    return tok


def train_wordpiece_tokenizer(texts: Iterable[str], vocab_size: int = 8000) -> Tokenizer:
    """BERT-style uncased WordPiece; ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, clean_text=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=MLM_SPECIALS, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    # The trainer orders tied pieces differently from run to run (the set is stable): sort the
    # ids after the specials, so one corpus always gives one tokenizer (exact resume, reproducible
    # checkpoints). WordPiece matching depends on the set only.
    vocab = tok.get_vocab()
    pieces = sorted(t for t in vocab if t not in MLM_SPECIALS)
    tok.model = models.WordPiece({t: i for i, t in enumerate(MLM_SPECIALS + pieces)}, unk_token="[UNK]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    for i, name in enumerate(MLM_SPECIALS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    return tok


def build_tokenizer(
    kind: str, data_path: Path, vocab_size: int, seed: int, n_test: int = 2000, n_dev: int = 1000
) -> Tokenizer:
    """Train on the training side of the same split the trainer uses (no test text leaks in)."""
    if kind == "generator":
        train, _ = data.split_stories(data.load_stories(data_path), seed=seed)
        return train_generator_tokenizer(train, vocab_size)
    if kind == "mlm":
        from export.train import mlm_data

        passages, _ = mlm_data.split_passages(mlm_data.load_passages(data_path), seed=seed)
        return train_wordpiece_tokenizer([p for ps in passages.values() for p in ps], vocab_size)
    split = data.split_tatoeba(data.load_tatoeba(data_path), seed=seed, n_test=n_test, n_dev=n_dev)
    texts = [t for en, fr in split.train for t in (en, fr)]
    return train_translator_tokenizer(texts, vocab_size)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export tokenizer", description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=["generator", "translator", "mlm"])
    p.add_argument("--data", type=Path, help="corpus path (default: the shared corpus for the kind)")
    p.add_argument("--vocab-size", type=int, help="default 4096 (generator) / 8000 (translator, mlm)")
    p.add_argument("--seed", type=int, default=0, help="split seed (must match the training run)")
    p.add_argument("--split-test", type=int, default=2000, help="translator: test sentences left out")
    p.add_argument("--split-dev", type=int, default=1000, help="translator: dev sentences left out")
    p.add_argument("--out", type=Path, required=True, help="where to write tokenizer.json")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv[1:])
    path = args.data or data.DEFAULT_DATA[args.kind]
    vocab = args.vocab_size or (4096 if args.kind == "generator" else 8000)
    tok = build_tokenizer(args.kind, path, vocab, args.seed, args.split_test, args.split_dev)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out))
    log.info("wrote %s (%d tokens)", args.out, tok.get_vocab_size())
    return 0


def load_or_train_tokenizer(kind: str, args, run_dir: Path) -> Tokenizer:
    """The training run's tokenizer: args.tokenizer or run_dir/tokenizer.json, trained there when absent."""
    path = args.tokenizer or run_dir / "tokenizer.json"
    if not Path(path).exists():
        log.info("training the %s tokenizer (vocab %d) into %s", kind, args.vocab_size, path)
        tok = build_tokenizer(kind, args.data, args.vocab_size, args.seed, args.split_test, args.split_dev)
        tok.save(str(path))
    return Tokenizer.from_file(str(path))
