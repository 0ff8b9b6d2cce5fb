"""Packed or padded by measurement at load (`encoder_layout` auto, service/engine/layout.py).

Real servers over the tiny model directories: with auto every encoder kind that has both graphs
times them and serves one, says which and why in ListModels, and answers as the pinned layout
does; packed / padded and `embed_pack_row_tokens` 0 pin it without timing; the timing passes are
not counted in the batch metrics. The timed batch itself: mixed lengths within the model's input
limit, a fill-mask model's inputs carrying its mask.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from service.engine.layout import PAIR_LENGTHS, SAMPLE_LENGTHS, sample_batch
from service.proto import inference_pb2 as pb
from tests.fixtures.server import metric

ENCODERS = ("tiny-embed", "tiny-fill-mask")
MEASURED = re.compile(
    r"^measured at load: packed \d+\.\d\d ms, padded \d+\.\d\d ms a batch of 16 inputs of \d+-\d+ tokens"
)


async def infos(server) -> dict[str, dict[str, str]]:
    reply = await server.models.ListModels(pb.ListModelsRequest())
    return {m.name: dict(m.manifest) for m in reply.models}


async def vectors(server, texts: list[str]) -> np.ndarray:
    reply = await server.embedding.Embed(pb.EmbedRequest(model="tiny-embed", inputs=texts))
    return np.array([list(e.values) for e in reply.embeddings], np.float32)


async def test_auto_times_both_layouts_and_says_which_serves(start_server):
    texts = ["a", "a somewhat longer sentence to embed, with numbers 12,345!", "two words"]
    before = metric("ts_batch_tokens_count", {"model": "tiny-embed"})
    auto = await start_server(encoder_layout="auto")
    assert metric("ts_batch_tokens_count", {"model": "tiny-embed"}) - before == 1  # the warm-up pass only
    got = await infos(auto)
    for name in ENCODERS:
        assert got[name]["serving.execution"] in ("packed", "padded")
        assert MEASURED.match(got[name]["serving.execution_chosen_by"]), got[name]["serving.execution_chosen_by"]
    layout = got["tiny-embed"]["serving.execution"]
    pinned = await start_server(encoder_layout=layout)
    assert (await infos(pinned))["tiny-embed"]["serving.execution_chosen_by"] == f"settings (encoder_layout {layout})"
    np.testing.assert_array_equal(await vectors(auto, texts), await vectors(pinned, texts))


@pytest.mark.parametrize(
    "overrides, layout, why",
    [
        ({"encoder_layout": "padded"}, "padded", "settings (encoder_layout padded)"),
        ({"encoder_layout": "packed"}, "packed", "settings (encoder_layout packed)"),
        ({"encoder_layout": "auto", "embed_pack_row_tokens": 0}, "padded", "settings (embed_pack_row_tokens 0)"),
    ],
)
async def test_settings_pin_the_layout_without_timing(start_server, overrides, layout, why):
    got = await infos(await start_server(**overrides))
    for name in ENCODERS:
        assert (got[name]["serving.execution"], got[name]["serving.execution_chosen_by"]) == (layout, why)


def test_the_timed_batch_is_mixed_within_the_input_limit():
    batch = sample_batch(vocab=500, longest=32, decorate=lambda ids: [ids[0], 4, *ids[2:]])
    assert [len(e) for e in batch] == [min(n, 32) for n in SAMPLE_LENGTHS]
    assert all(e.ids[1] == 4 and all(250 <= t < 500 for t in e.ids[2:]) for e in batch)
    assert all(e.type_ids == [0] * len(e) for e in batch)
    assert [len(e) for e in sample_batch(500, 100, lengths=PAIR_LENGTHS)] == [min(n, 100) for n in PAIR_LENGTHS]
    assert [e.ids for e in sample_batch(500, 32)] == [e.ids for e in sample_batch(500, 32)]  # seeded
