"""The translator's packed encoder: the same translations as the padded encoder and as alone.

Real servers over the tiny translator, one packed (the default) and one padded
(`embed_pack_row_tokens=0`); greedy and beam, mixed lengths, a source at the input limit, a batch
of one. The export gate is shown refusing a packed encoder whose attention leaks across sources.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from export.gate import parity
from export.models import layers
from export.onnx import packed
from export.tiny import MAX_INPUT_TOKENS, build_tiny
from service.engine.packing import pack
from service.manifest import load_model_dir
from service.proto import inference_pb2 as pb
from service.runtime import Runtime
from service.settings import Settings
from service.translation.encoder import unpack
from service.translation.model import TranslateOptions, TranslationModel
from tests.fixtures.server import metric
from tests.paths import ROOT

SOURCES = [
    "Yes",
    "Where is the station?",
    "We should leave before it rains, Tom.",
    "a",
    "He paid 12,500 € at the café in Zürich.",
]


@pytest.fixture(scope="module")
def translate_root(tiny_models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("translate-models")
    (root / "tiny-translate").symlink_to(Path(tiny_models_root) / "tiny-translate", target_is_directory=True)
    return root


def at_the_limit(model_dir: Path) -> str:
    """A source of exactly the model's max_input_tokens tokens."""
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "the longest source: " + "abcdefgh" * 20
    while len(tok.encode(text).ids) > MAX_INPUT_TOKENS["translation"]:
        text = text[:-1]
    assert len(tok.encode(text).ids) == MAX_INPUT_TOKENS["translation"]
    return text


async def translate(server, inputs: list[str], **options) -> list[tuple[str, float]]:
    reply = await server.translation.Translate(
        pb.TranslateRequest(model="tiny-translate", inputs=inputs, max_length=24, **options)
    )
    return [(t.text, round(t.score, 4)) for t in reply.translations]


def test_unpack_gathers_each_source_in_order():
    seqs = [[7] * 5, [8, 9, 10], [11] * 9, [12]]
    p = pack(seqs, 10, pad_id=0)
    index, mask = unpack(p)
    assert index.shape == mask.shape == (4, 9)
    for i, s in enumerate(seqs):
        assert p.input_ids.reshape(-1)[index[i, : len(s)]].tolist() == s
        assert mask[i].tolist() == [1] * len(s) + [0] * (9 - len(s))
        assert (index[i, len(s) :] == index[i, 0]).all()  # masked slots read the source's own first token


@pytest.mark.parametrize("beam_size", [1, 4])
async def test_packed_equals_padded_and_alone(translate_root, start_server, beam_size):
    sources = [*SOURCES, at_the_limit(translate_root / "tiny-translate")]
    packed_server = await start_server(translate_root)
    padded_server = await start_server(translate_root, embed_pack_row_tokens=0)
    together = await translate(packed_server, sources, beam_size=beam_size)
    concurrent = await asyncio.gather(*(translate(packed_server, [s], beam_size=beam_size) for s in sources))
    alone = [(await translate(packed_server, [s], beam_size=beam_size))[0] for s in sources]
    padded = await translate(padded_server, sources, beam_size=beam_size)
    assert together == [c[0] for c in concurrent] == alone == padded
    assert len({t for t, _ in together}) > 1  # the sources do translate differently
    info = await packed_server.models.ListModels(pb.ListModelsRequest())
    padded_info = await padded_server.models.ListModels(pb.ListModelsRequest())
    assert info.models[0].manifest["serving.execution"] == "packed"
    assert padded_info.models[0].manifest["serving.execution"] == "padded"
    assert metric("ts_batch_padding_ratio_count", {"model": "tiny-translate"}) > 0


async def test_a_directory_without_a_packed_encoder_serves_padded(translate_root, tmp_path, start_server):
    old = tmp_path / "tiny-translate"
    shutil.copytree(translate_root / "tiny-translate", old)
    manifest = json.loads((old / "model.json").read_text())
    manifest["graphs"] = [g for g in manifest["graphs"] if g["role"] != "packed"]
    (old / "model.json").write_text(json.dumps(manifest))
    for f in old.glob("packed*.onnx"):
        f.unlink()
    server = await start_server(tmp_path)
    info = await server.models.ListModels(pb.ListModelsRequest())
    assert info.models[0].manifest["serving.execution"] == "padded"
    reference = await translate(await start_server(translate_root), SOURCES)
    assert await translate(server, SOURCES) == reference


async def test_the_trained_translator_packed_equals_padded(trained_translator_dir):
    """The shipped model: greedy and beam tokens of 80 test sentences, packed and padded."""
    lines = (ROOT / "tests" / "data" / "tatoeba-en-fr-160.txt").read_text(encoding="utf-8").splitlines()
    english = lines[::2]
    results = []
    for row_tokens in (128, 0):
        runtime = Runtime(
            Settings.from_env(env={}, models=str(trained_translator_dir.parent), embed_pack_row_tokens=row_tokens)
        )
        model = TranslationModel.load(load_model_dir(trained_translator_dir), runtime.settings, runtime)
        await model.start()
        try:
            assert model.info()["manifest"]["serving.execution"] == ("packed" if row_tokens else "padded")
            greedy = await model.translate(english, TranslateOptions())
            beam = await model.translate(english[:16], TranslateOptions(beam_size=4))
            results.append([t.token_ids for t in greedy.translations + beam.translations])
        finally:
            await model.stop()
            runtime.close()
    assert results[0] == results[1]


def test_the_manifest_records_the_packed_gate(translate_root):
    manifest = json.loads((translate_root / "tiny-translate" / "model.json").read_text())
    for graph in (g for g in manifest["graphs"] if g["role"] == "packed"):
        figures = graph["parity"]["packed"]
        assert figures["cross_kv_max_abs_diff"] <= parity.LOGITS_MAX_ABS
        assert figures["alone_max_abs_diff"] <= parity.LOGITS_MAX_ABS and figures["greedy_identical"]


def test_the_gate_refuses_a_packed_encoder_that_attends_across_sources(monkeypatch, tmp_path):
    def leaky(segment_ids):  # every real token sees every real token of its row
        return (segment_ids[:, None, :] > 0)[:, :, None, :].expand(-1, 1, segment_ids.shape[1], -1)

    monkeypatch.setattr(layers, "same_segment", leaky)
    with pytest.raises(parity.ParityError, match="packed translator"):
        build_tiny("translation", tmp_path / "leaky")
    assert not (tmp_path / "leaky").exists()


def test_a_reduced_precision_packed_encoder_computes_alone_what_it_computes_among_others(tmp_path):
    """fp16 rounding on the CPU amplifies the SIMD grouping of softmax sums unless sources start aligned."""
    model_dir = build_tiny("translation", tmp_path / "t", variants=("optimized", "fp16"))
    fp16 = model_dir.manifest.graph("packed", "fp16").parity["packed"]
    assert fp16["alone_max_abs_diff"] == 0.0 and fp16["quality_ok"]
    tok = Tokenizer.from_file(str(tmp_path / "t" / "tokenizer.json"))
    seqs, pad = [tok.encode(s).ids for s in SOURCES], model_dir.manifest.special_tokens["pad"]
    sess = parity.session(tmp_path / "t" / "packed.fp16.onnx")
    together, _ = packed.translator_cross(sess, seqs, pad, 64, 16)
    for i, s in enumerate(seqs):
        alone, _ = packed.translator_cross(sess, [s], pad, 64, 16)
        assert all(np.array_equal(a[0, :, : len(s)], t[i, :, : len(s)]) for a, t in zip(alone, together, strict=True))
