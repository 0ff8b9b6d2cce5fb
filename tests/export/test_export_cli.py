"""`python -m export checkpoint|tiny`: trained-checkpoint directories become verified model directories."""

from __future__ import annotations

import pytest

from export.__main__ import main
from export.tiny import byte_tokenizer, tiny_model
from export.train.checkpoint import save_checkpoint
from service.manifest import load_model_dir

SPECIALS = {
    "generation": {"bos": 0, "eos": 0, "pad": 0},
    "translation": {"pad": 0, "bos": 1, "eos": 2, "unk": 3, "decoder_start": 1},
}


@pytest.mark.parametrize("kind,max_length", [("generation", 96), ("translation", 40)])
def test_checkpoint_command_exports_through_the_gate(tmp_path, kind, max_length):
    tok = byte_tokenizer(kind)
    tok.save(str(tmp_path / "tok.json"))
    ckpt = save_checkpoint(
        tiny_model(kind, tok.get_vocab_size()),
        tmp_path / "ckpt",
        name=f"ckpt-{kind}",
        tokenizer_path=tmp_path / "tok.json",
        special_tokens=SPECIALS[kind],
        max_length=max_length,
        training={"steps": 0},
    )  # fp16 storage, as shipped
    out = tmp_path / "models" / f"ckpt-{kind}"
    assert main(["checkpoint", str(ckpt), "--out", str(out), "--variants", ""]) == 0
    m = load_model_dir(out).manifest
    assert m.kind == kind and m.name == f"ckpt-{kind}" and m.special_tokens == SPECIALS[kind]
    assert m.parity["greedy_identical"] and m.extra["training"] == {"steps": 0}
    if kind == "generation":
        assert m.max_input_tokens + m.max_output_tokens == max_length
    else:
        assert m.max_input_tokens == max_length and m.max_output_tokens == 2 * max_length


def test_tiny_command_and_unknown_variant(tmp_path):
    assert main(["tiny", "--kind", "embedding", "--out", str(tmp_path / "e")]) == 0
    assert load_model_dir(tmp_path / "e").manifest.variants("encoder") == ["fp32"]
    with pytest.raises(SystemExit, match="unknown variant"):
        main(["tiny", "--kind", "embedding", "--out", str(tmp_path / "x"), "--variants", "bf16"])
