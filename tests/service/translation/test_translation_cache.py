"""The translator's KV buffers (service/translation/cache.py) on the tiny model's real graphs.

A row's logits must be bit-identical alone and in any batch (rows of other lengths joining,
leaving, reordered and repeated as beam search does), on both cache paths (numpy without IO
binding, OrtValues bound as past and present); the buffers grow past their first slots and
shrink when the rows that needed them leave.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from service.engine.graphio import GraphIO
from service.manifest import load_model_dir
from service.translation.cache import SLOTS_FIRST, SlotBatch, slots_for

SOURCES = [[5, 9, 13, 4], [7, 7, 21, 30, 44, 8, 2, 19, 3], [11, 2]]


@pytest.fixture(scope="module")
def graphs(tiny_models_root):
    d = load_model_dir(tiny_models_root / "tiny-translate")
    m = d.manifest

    def session(role: str) -> ort.InferenceSession:
        return ort.InferenceSession(str(d.file(m.graph(role, "fp32").file)), providers=["CPUExecutionProvider"])

    decoder = session("decoder")
    return session("encoder"), decoder, GraphIO.inspect(decoder, m.architecture), m.architecture["max_positions"]


def constants(encoder, io: GraphIO, sources: list[list[int]]) -> dict:
    """The decoder's cross K/V and source mask for these sources (right-padded)."""
    ids = np.zeros((len(sources), max(map(len, sources))), np.int64)
    for i, s in enumerate(sources):
        ids[i, : len(s)] = s
    mask = (ids != 0).astype(np.int64)
    cross = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    names = [n.replace("past_key_values", "cross_key_values") for n in io.past_names]
    return {"encoder_attention_mask": mask, **dict(zip(names, cross))}


def decode(graphs, device, plan: dict[int, list]) -> dict[int, list[np.ndarray]]:
    """Greedy steps over a batch whose rows change as `plan` says: {step: [("join", source index),
    ("select", rows)]}; -> each source's logits per step it took part in (by source index; a
    repeated row's copies are recorded under its source too)."""
    encoder, decoder, io, positions = graphs
    cache = SlotBatch(io, positions, device)
    members: list[int] = []  # the source of each row
    tokens: list[list[int]] = []  # the tokens of each row so far
    out: dict[int, list[np.ndarray]] = {}
    for step in range(max(plan) + 1):
        for action, arg in plan.get(step, []):
            if action == "join":
                cache.add_rows(1)
                members.append(arg)
                tokens.append([1])
            else:
                cache.select(np.asarray(arg))
                members, tokens = [members[r] for r in arg], [list(tokens[r]) for r in arg]
        feeds = {
            "input_ids": np.asarray([[t[-1]] for t in tokens], np.int64),
            "position_ids": np.asarray([[len(t) - 1] for t in tokens], np.int64),
        }
        logits = cache.step(decoder, feeds, constants(encoder, io, [SOURCES[s] for s in members]))
        for row, source in enumerate(members):
            out.setdefault(source, []).append(logits[row].copy())
            tokens[row].append(int(logits[row].argmax()))
    return out


@pytest.mark.parametrize("device", [None, "cpu"], ids=["numpy", "bound"])
def test_a_rows_logits_are_the_same_alone_and_in_any_batch(graphs, device):
    steps = SLOTS_FIRST + 8  # past the first buffer: it grows mid-run
    alone = {s: decode(graphs, device, {0: [("join", s)], steps - 1: []})[s] for s in range(len(SOURCES))}
    crowd = decode(
        graphs,
        device,
        {
            0: [("join", 1)],
            3: [("join", 0)],  # joins rows 3 positions ahead
            5: [("join", 2)],
            9: [("select", [2, 0, 1])],  # reordered
            14: [("select", [1, 2])],  # source 2 leaves
            steps - 1: [],
        },
    )
    for source, offset, count in ((1, 0, steps), (0, 0, steps - 3)):
        for i in range(count):
            assert np.array_equal(crowd[source][offset + i], alone[source][i]), (source, i)
    assert all(np.array_equal(c, a) for c, a in zip(crowd[2], alone[2][: len(crowd[2])]))


def test_repeated_rows_continue_alike_and_the_buffers_follow_the_rows(graphs):
    encoder, decoder, io, positions = graphs
    cache = SlotBatch(io, positions, "cpu")
    cache.add_rows(2)
    feeds = {"input_ids": np.ones((2, 1), np.int64), "position_ids": np.zeros((2, 1), np.int64)}
    for step in range(SLOTS_FIRST + 1):
        feeds["position_ids"][:] = step
        logits = cache.step(decoder, feeds, constants(encoder, io, SOURCES[:2]))
    assert cache.slots == slots_for(SLOTS_FIRST + 2, positions) == 2 * SLOTS_FIRST
    cache.select(np.asarray([1, 1, 1]))  # beam search: one parent's three children
    assert cache.rows == 3 and cache.lengths.tolist() == [SLOTS_FIRST + 1] * 3
    feeds = {"input_ids": np.full((3, 1), 7, np.int64), "position_ids": np.full((3, 1), SLOTS_FIRST + 1, np.int64)}
    logits = cache.step(decoder, feeds, constants(encoder, io, [SOURCES[1]] * 3))
    assert np.array_equal(logits[0], logits[1]) and np.array_equal(logits[0], logits[2])
    cache.select(np.zeros(0, np.int64))
    cache.add_rows(1)
    assert cache.rows == 1 and cache.lengths.tolist() == [0] and cache.slots == 0
    one = {"input_ids": np.ones((1, 1), np.int64), "position_ids": np.zeros((1, 1), np.int64)}
    cache.step(decoder, one, constants(encoder, io, SOURCES[:1]))
    assert cache.slots == SLOTS_FIRST


def test_a_row_cannot_pass_the_models_positions(graphs):
    encoder, decoder, io, _ = graphs
    cache = SlotBatch(io, 3, None)
    cache.add_rows(1)
    feeds = {"input_ids": np.ones((1, 1), np.int64), "position_ids": np.zeros((1, 1), np.int64)}
    for _ in range(3):
        cache.step(decoder, feeds, constants(encoder, io, SOURCES[:1]))
    with pytest.raises(RuntimeError, match="3 positions"):
        cache.step(decoder, feeds, constants(encoder, io, SOURCES[:1]))
