"""The fill-mask model directory (export/onnx/fill_mask.py): contract, tokenizer, ONNX vs PyTorch parity."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export.gate import parity
from export.onnx import fill_mask
from export.tiny import NAMES, byte_tokenizer, tiny_model
from service.manifest import ModelDirError, load_model_dir

KIND = "fill-mask"


def test_manifest_follows_the_contract(tiny_models_root):
    m = load_model_dir(tiny_models_root / NAMES[KIND]).manifest
    assert m.kind == KIND and set(m.variants("encoder")) >= {"fp32", "optimized"}
    g = m.graph("encoder")
    assert [(t.name, t.dtype, t.shape) for t in g.inputs] == [
        ("input_ids", "int64", ["batch", "sequence"]),
        ("attention_mask", "int64", ["batch", "sequence"]),
    ]
    vocab = byte_tokenizer(KIND).get_vocab_size()
    assert [(t.name, t.dtype, t.shape) for t in g.outputs] == [("logits", "float32", ["batch", "sequence", vocab])]
    assert {"cls", "sep", "pad", "unk", "mask"} <= set(m.special_tokens) and m.max_input_tokens > 0
    assert m.parity["logits_max_abs_diff"] <= parity.LOGITS_MAX_ABS and m.graph("attention")


@pytest.mark.parametrize("text", ["[MASK]", " [MASK].", "The cat sat on the [MASK].", "a[MASK]b", "[MASK] [MASK]"])
def test_mask_text_encodes_to_the_mask_id_between_cls_and_sep(tiny_models_root, text):
    from tokenizers import Tokenizer

    md = load_model_dir(tiny_models_root / NAMES[KIND])
    ids = Tokenizer.from_file(str(md.file("tokenizer.json"))).encode(text).ids
    special = md.manifest.special_tokens
    assert ids[0] == special["cls"] and ids[-1] == special["sep"]
    assert ids.count(special["mask"]) == text.count("[MASK]")


def test_onnx_logits_match_pytorch_on_a_padded_batch(tiny_models_root):
    md = load_model_dir(tiny_models_root / NAMES[KIND])
    tok = byte_tokenizer(KIND)
    model = tiny_model(KIND, tok.get_vocab_size())
    rows = [tok.encode(t).ids for t in ["Hello [MASK] world.", "[MASK]", "Ça coûte 12 € [MASK] rien, vraiment."]]
    ids, mask = parity.pad_batch(rows, md.manifest.special_tokens["pad"], left=False)
    for variant in ("fp32", "optimized"):
        sess = parity.session(md.file(md.manifest.graph("encoder", variant).file))
        got = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        real = mask.astype(bool)
        assert np.abs(got[real] - ref[real]).max() <= 1e-4, variant
        assert (got[real].argmax(-1) == ref[real].argmax(-1)).all()


def test_gate_refuses_a_graph_that_computes_something_else(tiny_models_root):
    tok = byte_tokenizer(KIND)
    model = tiny_model(KIND, tok.get_vocab_size())
    with torch.no_grad():
        model.head.bias += 0.01  # the graph on disk was exported before this change
    md = load_model_dir(tiny_models_root / NAMES[KIND])
    with pytest.raises(parity.ParityError, match="fill-mask logits"):
        fill_mask.fill_mask_parity(model, md.file("encoder.onnx"), [[tok.encode("Hello [MASK].").ids]], 0)


def test_manifest_without_a_mask_token_is_refused(tiny_models_root, tmp_path):
    from tests.fixtures.models import copy_model_dir

    d = copy_model_dir(tiny_models_root / NAMES[KIND], tmp_path)
    manifest = json.loads((d / "model.json").read_text())
    del manifest["special_tokens"]["mask"]
    (d / "model.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelDirError, match="'mask'"):
        load_model_dir(d)
