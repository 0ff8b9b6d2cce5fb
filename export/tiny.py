"""Tiny random-weight models of each kind, exported through the real pipeline (tests, smoke checks).

Weights are seeded, so a tiny model directory is reproducible. The tokenizers are byte-level BPE
with no merges (every UTF-8 byte is one token, plus the kind's special tokens): built in code,
nothing to download or train, and any text round-trips. Weights are drawn wider than the usual
0.02 init so greedy decoding produces varied tokens (a model that repeats one token would hide
KV-cache bugs).

The fill-mask tokenizer has `[MASK]` as an added special token, so the literal text "[MASK]"
in an input encodes to its id, and a post-processor that adds [CLS] ... [SEP] (BERT's layout).

Directory names used by the test fixtures: tiny-embed, tiny-gpt, tiny-translate, tiny-fill-mask.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from torch import nn

from export.build import build_model_dir
from export.models.decoder import DecoderConfig, GPTDecoder
from export.models.encoder import EncoderConfig, SentenceEncoder
from export.models.mlm import MaskedLM
from export.models.seq2seq import Seq2SeqConfig, Translator
from service.manifest import ModelDir

NAMES = {
    "embedding": "tiny-embed",
    "generation": "tiny-gpt",
    "translation": "tiny-translate",
    "fill-mask": "tiny-fill-mask",
}
SPECIALS = {
    "embedding": ["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
    "fill-mask": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "generation": ["<|endoftext|>"],
    "translation": ["<pad>", "<s>", "</s>", "<unk>"],
}
ROLES = {  # the manifest's special token roles -> the tokens above
    "embedding": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"},
    "fill-mask": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "generation": {"bos": "<|endoftext|>", "eos": "<|endoftext|>", "pad": "<|endoftext|>"},
    "translation": {"pad": "<pad>", "bos": "<s>", "decoder_start": "<s>", "eos": "</s>", "unk": "<unk>"},
}
MAX_INPUT_TOKENS = {"embedding": 48, "generation": 48, "translation": 48, "fill-mask": 48}
MAX_OUTPUT_TOKENS = 64
SEED = 1234


def byte_tokenizer(kind: str) -> Tokenizer:
    """Byte-level BPE without merges; special tokens take the first ids."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIALS[kind] + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(SPECIALS[kind])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    ids = {t: vocab[t] for t in SPECIALS[kind]}
    if kind in ("embedding", "fill-mask"):
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])]
        )
    elif kind == "generation":
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", ids["<|endoftext|>"])]
        )
    else:
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", ids["</s>"])])
    return tok


def _widen(model: nn.Module, std: float) -> nn.Module:
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
    return model.eval()


def tiny_model(kind: str, vocab_size: int) -> nn.Module:
    torch.manual_seed(SEED)
    if kind in ("embedding", "fill-mask"):
        cfg = EncoderConfig(
            vocab_size=vocab_size,
            d_model=32,
            n_layers=2,
            n_heads=4,
            d_ff=64,
            max_positions=64,
            max_length=MAX_INPUT_TOKENS[kind],
        )
        return _widen(SentenceEncoder(cfg), 0.5) if kind == "embedding" else _widen(MaskedLM(cfg), 0.3)
    if kind == "generation":
        gen = DecoderConfig(vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=160)
        return _widen(GPTDecoder(gen), 0.3)
    s2s = Seq2SeqConfig(
        vocab_size=vocab_size,
        d_model=32,
        n_encoder_layers=2,
        n_decoder_layers=2,
        n_heads=4,
        d_ff=64,
        max_positions=160,
        dropout=0.0,
    )
    return _widen(Translator(s2s), 0.3)


def special_tokens(kind: str, tok: Tokenizer) -> dict[str, int]:
    """The manifest's special_tokens of the kind's tiny model: role -> id in its tokenizer."""
    vocab = tok.get_vocab()
    return {role: vocab[token] for role, token in ROLES[kind].items()}


def build_tiny(kind: str, out: Path, variants=(), device: str = "cpu") -> ModelDir:
    """Export the tiny model of one kind into out (a model directory), through the parity gate."""
    tok = byte_tokenizer(kind)
    return build_model_dir(
        kind,
        tiny_model(kind, tok.get_vocab_size()),
        tok,
        out,
        name=NAMES[kind],
        special_tokens=special_tokens(kind, tok),
        max_input_tokens=MAX_INPUT_TOKENS[kind],
        max_output_tokens=MAX_OUTPUT_TOKENS if kind in ("generation", "translation") else None,
        variants=variants,
        extra={"tiny": True, "seed": SEED},
        device=device,
    )
