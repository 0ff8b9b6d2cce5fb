"""Packed or padded by measurement at load (`encoder_layout` auto, service/engine/layout.py).

Real servers over the tiny model directories: with auto every encoder kind that has both graphs
times them and serves one, says which and why in ListModels, and answers as the pinned layout
does; packed / padded and `embed_pack_row_tokens` 0 pin it without timing; the timing passes are
not counted in the batch metrics. The timed batch itself: mixed lengths within the model's input
limit, a fill-mask model's inputs carrying its mask.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from service.embedding.engine import EmbeddingEngine
from service.embedding.model import load_engine
from service.engine.layout import (
    CLEAR_AFTER,
    EXPLORE_BUDGET,
    EXPLORE_EVERY,
    MAX_EXPLORE_EVERY,
    MIN_SAMPLES,
    PAIR_LENGTHS,
    SAMPLE_LENGTHS,
    AdaptiveEncoder,
    explore_every,
    sample_batch,
)
from service.manifest import load_model_dir
from service.proto import inference_pb2 as pb
from service.runtime import Runtime
from service.settings import Settings
from tests.fixtures.server import metric

ENCODERS = ("tiny-embed", "tiny-fill-mask")
MEASURED = re.compile(
    r"^(measured on the traffic: .*; first )?measured at load: packed \d+\.\d\d ms, padded \d+\.\d\d ms "
    r"a batch of 16 inputs of \d+-\d+ tokens"
)

PASSES = re.compile(
    r"; padded batches run (in passes of similar length \(a pass costs \d+ tokens, measured at load\)"
    r"|whole \(a pass's cost did not measure\))"
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
    for _ in range(2 * MIN_SAMPLES):  # one call at a time: a batch each, both layouts timed on them
        await vectors(auto, texts[:2])
    now = (await infos(auto))["tiny-embed"]
    chosen = now["serving.execution_chosen_by"]
    assert re.match(r"^measured on the traffic: packed \d+\.\d\d us a token \(\d+ batches\), padded ", chosen), chosen
    # the layout serving now: the traffic may have changed the one the load chose (packed and padded
    # agree to ~1e-7, not bit for bit); the next batch is no exploring one (it comes 1 in 50 at most)
    layout = now["serving.execution"]
    pinned = await start_server(encoder_layout=layout)
    why = f"settings (encoder_layout {layout})"
    pinned_by = (await infos(pinned))["tiny-embed"]["serving.execution_chosen_by"]
    # a padded engine also says how its batches run (the cost of a pass, measured at its load)
    assert pinned_by.startswith(why) and (
        pinned_by == why if layout == "packed" else PASSES.fullmatch(pinned_by[len(why) :])
    ), pinned_by
    # one input a call: a padded batch of mixed lengths may split into passes, by a pass's cost that
    # each server measures at its own load (and a row's padding moves its last bits)
    for text in texts:
        np.testing.assert_array_equal(await vectors(auto, [text]), await vectors(pinned, [text]), err_msg=layout)


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
        chosen = got[name]["serving.execution_chosen_by"]
        assert got[name]["serving.execution"] == layout and chosen.startswith(why), chosen
        # A padded engine measures what one more pass costs (its batches may run in several); a
        # packed engine has no passes to split.
        runs = chosen[len(why) :]
        if layout == "padded":
            assert PASSES.fullmatch(runs), chosen
        else:
            assert runs == "", chosen


class Slowed(EmbeddingEngine):
    """The real padded engine, made slower by a fixed pause per batch (the policy's input)."""

    def __init__(self, engine: EmbeddingEngine, pause_s: float):
        self.__dict__.update(engine.__dict__)
        self.pause_s = pause_s

    def forward(self, batch):
        time.sleep(self.pause_s)
        return super().forward(batch)


def _engines(embed_dir: Path, runtime: Runtime) -> dict[str, EmbeddingEngine]:
    out = {}
    for layout in ("packed", "padded"):
        settings = Settings.from_env(env={}, models=str(embed_dir.parent), encoder_layout=layout)
        out[layout] = cast(EmbeddingEngine, load_engine(load_model_dir(embed_dir), settings, runtime)[1])
    return out


def test_the_traffic_decides_which_layout_serves(tiny_models_root):
    """AdaptiveEncoder alternates until each layout has CLEAR_AFTER batches; a layout that costs
    clearly more per token on the traffic (here the padded engine pauses 20 ms a batch) is left at
    once and explored only rarely after (explore_every); each batch answers as its engine does."""
    runtime = Runtime(Settings.from_env(env={}, models=str(tiny_models_root)))
    engines = _engines(tiny_models_root / "tiny-embed", runtime)
    slow = {"packed": engines["packed"], "padded": Slowed(engines["padded"], 0.02)}
    adaptive = AdaptiveEncoder(slow, "padded", "measured at load: (test)", "tiny-embed")
    batch = sample_batch(vocab=256, longest=60)
    used = []
    for _ in range(2 * CLEAR_AFTER + EXPLORE_EVERY):
        before = dict(adaptive.runs)
        out = adaptive.forward(batch)
        used.append(next(k for k, n in adaptive.runs.items() if n > before[k]))
        np.testing.assert_allclose(out, engines[used[-1]].forward(batch), rtol=0, atol=1e-5)
    assert adaptive.layout == "packed"
    assert used[: 2 * CLEAR_AFTER] == ["packed", "padded"] * CLEAR_AFTER  # the other first, alternating
    assert used[2 * CLEAR_AFTER :].count("padded") == 0  # 20 ms a batch: > 2x, explored 1 in > 50
    assert adaptive.chosen_by.startswith("measured on the traffic: packed ")
    runtime.close()


class Timed:
    """An engine whose batches take the wall time the test sets (the policy's only input)."""

    layout, counted, chosen_by, provider = "", True, "", "CPUExecutionProvider"

    def __init__(self, name: str, seconds: float):
        self.layout, self.seconds = name, seconds

    def forward(self, batch):
        time.sleep(self.seconds)
        return self.layout


@pytest.mark.parametrize(
    "served_s, other_s, alternated, explored",
    [
        (0.004, 0.0055, MIN_SAMPLES, 1),  # alike (1.4x at most): 8 each, then 1 batch in 50
        (0.002, 0.010, CLEAR_AFTER, 0),  # 5x: 3 each, then 1 in 400 (none in the next 60)
    ],
)
def test_a_costlier_layout_is_explored_less(served_s, other_s, alternated, explored):
    adaptive = AdaptiveEncoder(
        {"packed": Timed("packed", served_s), "padded": Timed("padded", other_s)}, "packed", "(test)", "m"
    )
    batch = sample_batch(vocab=256, longest=8)
    used = [adaptive.forward(batch) for _ in range(2 * alternated + EXPLORE_EVERY + 10)]
    assert used[: 2 * alternated] == ["padded", "packed"] * alternated
    assert adaptive.layout == "packed"
    assert used[2 * alternated :].count("padded") == explored


def test_exploring_costs_at_most_its_budget():
    assert [explore_every(r) for r in (0.5, 1.0, 1.5)] == [EXPLORE_EVERY] * 3
    for ratio in (1.5, 2.0, 3.4, 8.0, 11.0):  # the other layout's extra cost per served batch
        assert (ratio - 1.0) / explore_every(ratio) <= EXPLORE_BUDGET + 1e-12
    assert explore_every(3.4) == 240 and explore_every(1e6) == MAX_EXPLORE_EVERY


def test_the_timed_batch_is_mixed_within_the_input_limit():
    batch = sample_batch(vocab=500, longest=32, decorate=lambda ids: [ids[0], 4, *ids[2:]])
    assert [len(e) for e in batch] == [min(n, 32) for n in SAMPLE_LENGTHS]
    assert all(e.ids[1] == 4 and all(250 <= t < 500 for t in e.ids[2:]) for e in batch)
    assert all(e.type_ids == [0] * len(e) for e in batch)
    assert [len(e) for e in sample_batch(500, 100, lengths=PAIR_LENGTHS)] == [min(n, 100) for n in PAIR_LENGTHS]
    assert [e.ids for e in sample_batch(500, 32)] == [e.ids for e in sample_batch(500, 32)]  # seeded
