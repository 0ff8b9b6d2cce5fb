"""A Marian folder's tokenizer (source.spm, target.spm, vocab.json) as one `tokenizers.Tokenizer`.

transformers' MarianTokenizer is the reference: it segments a source with source.spm
(SentencePiece unigram, a leading language code split off), maps each piece by its string through
vocab.json and appends </s>; it decodes through vocab.json and source.spm's piece decoder. One
tokenizer.json does both here: source.spm's normaliser and pre-tokenizer as transformers'
SpmConverter writes them, runs of unknown characters as one <unk> (`RUN`), a Unigram model with
vocab.json's ids and source.spm's scores, target-only pieces renamed with a private-use prefix
(`MARK`) so encoding never reaches them while decoding prints them, and special tokens and
language codes as added tokens. Source ids and decoded text match MarianTokenizer
(tests/export/convert/test_convert_marian.py); where they can differ: docs/models.md.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, processors
from tokenizers.models import Unigram

from export.convert.errors import ConversionError, refuse
from export.convert.folder import HFFolder

MARK = "\ue000"  # private use: prefixes target-only pieces so that encoding cannot produce them
RUN = "\ue001"  # private use: stands for a run of two or more characters source.spm does not know
SPM_MODEL_TYPES = {1: "unigram"}  # source.spm's trainer_spec.model_type -> name (BPE: 2, not converted)
NORMAL, USER_DEFINED, BYTE = 1, 4, 6  # SentencePiece piece types that segment text
# transformers' clean_up_tokenization, in its order (when tokenizer_config.json turns it on)
CLEANUP = [
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
]


def _source_model(folder: HFFolder):
    from sentencepiece import sentencepiece_model_pb2

    file = folder.path / "source.spm"
    if not file.is_file():
        raise ConversionError(f"{file}: missing (a Marian folder has source.spm, target.spm and vocab.json)")
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf module, no stubs
    proto.ParseFromString(file.read_bytes())
    spec = proto.trainer_spec
    if spec.model_type not in SPM_MODEL_TYPES:
        raise refuse(str(file), "trainer_spec.model_type", spec.model_type, list(SPM_MODEL_TYPES))
    if spec.byte_fallback:
        raise refuse(str(file), "trainer_spec.byte_fallback", True, [False])
    return proto


def _vocab(folder: HFFolder, specials: list[str]) -> dict[str, int]:
    vocab = folder.json("vocab.json")
    if not isinstance(vocab, dict):
        raise ConversionError(f"{folder.where('vocab.json')}: missing or not a piece -> id object")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ConversionError(f"{folder.where('vocab.json')}: ids are not 0 .. {len(vocab) - 1}, each once")
    missing = [t for t in specials if t not in vocab]
    if missing:
        raise ConversionError(f"{folder.where('vocab.json')}: special token(s) {missing} missing")
    return vocab


def _unknown_runs(known: set[str]) -> normalizers.Normalizer:
    """Each run of two or more characters source.spm does not know -> RUN, which no piece matches:
    one <unk>, as MarianTokenizer's one unknown piece for the run (not in vocab.json) gives."""
    chars = "".join(f"\\x{{{ord(c):x}}}" for c in sorted(known))
    return normalizers.Replace(Regex(f"[^{chars}]{{2,}}"), RUN)


def _decoder(cleanup: bool) -> decoders.Decoder:
    """MarianTokenizer.decode's text from the kept pieces: "▁" -> space, joined, stripped."""
    steps = [
        decoders.Replace(MARK, ""),
        decoders.Replace("▁", " "),
        decoders.Fuse(),
        decoders.Replace(Regex(r"\A\s+|\s+\z"), ""),
    ]  # after Fuse: one string, as str.strip()
    if cleanup:
        steps += [decoders.Replace(old, new) for old, new in CLEANUP]
    return decoders.Sequence(steps)


def marian_tokenizer(folder: HFFolder, hf_tokenizer) -> tuple[Tokenizer, dict]:
    """-> (the tokenizer, figures for the manifest). hf_tokenizer: the folder's MarianTokenizer
    (its special tokens and decode settings, as transformers reads tokenizer_config.json)."""
    from transformers.convert_slow_tokenizer import SpmConverter

    proto = _source_model(folder)
    specials = list(hf_tokenizer.all_special_tokens)
    vocab = _vocab(folder, specials)
    base = SpmConverter.build_tokenizer_from_spm_proto(proto, [(p.piece, p.score) for p in proto.pieces], legacy=True)
    scores = {p.piece: p.score for p in proto.pieces if p.type in (NORMAL, USER_DEFINED, BYTE)}
    known = {piece for piece in scores if len(piece) == 1}  # characters source.spm segments
    codes = [t for t in vocab if t.startswith(">>") and t.endswith("<<")]
    kept = set(specials) | set(codes)

    def entry(piece: str) -> tuple[str, float]:
        if piece in scores:
            return piece, scores[piece]
        if piece in kept or (len(piece) == 1 and piece not in known):  # special, code, a one-character run
            return piece, 0.0
        return MARK + piece, 0.0

    pieces = sorted(vocab, key=vocab.__getitem__)
    tok = Tokenizer(Unigram([entry(p) for p in pieces], unk_id=vocab[hf_tokenizer.unk_token], byte_fallback=False))
    tok.normalizer = normalizers.Sequence([base.normalizer, _unknown_runs(known)])
    tok.pre_tokenizer = base.pre_tokenizer
    tok.decoder = _decoder(bool(hf_tokenizer.clean_up_tokenization_spaces))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(c, special=False, normalized=False) for c in codes])
    eos = hf_tokenizer.eos_token
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, vocab[eos])]
    )
    figures = {
        "vocab": len(vocab),
        "target_only_pieces": sum(p not in scores and p not in kept for p in pieces),
        "source_pieces_not_in_vocab": sum(p not in vocab for p in scores),
        "language_codes": len(codes),
    }
    return tok, figures
