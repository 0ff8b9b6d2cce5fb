"""The scheduler's hand-off to the event loop and its batched metric updates, driven step by step."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Histogram

from service.generation.decoding import SamplingParams
from service.generation.model import GenerationModel
from service.generation.stepseries import observe_many
from tests.service.generation.test_engine import _sessions, generate, load, load_model_dir, runtime  # noqa: F401 - fixture


def test_observe_many_equals_repeated_observe():
    registry = CollectorRegistry()
    one = Histogram("one_seconds", "", buckets=(0.001, 0.01, 0.1), registry=registry)
    many = Histogram("many_seconds", "", buckets=(0.001, 0.01, 0.1), registry=registry)
    for value, count in [(0.0005, 3), (0.05, 7), (0.5, 2), (0.01, 1)]:
        for _ in range(count):
            one.observe(value)
        observe_many(many, value, count)

    def exposed(h: Histogram, name: str) -> dict:
        return {
            (s.name.replace(name, "x"), s.labels.get("le")): s.value
            for s in h.collect()[0].samples
            if not s.name.endswith("_created")
        }

    expected, got = exposed(one, "one"), exposed(many, "many")
    assert got.pop(("x_seconds_sum", None)) == pytest.approx(expected.pop(("x_seconds_sum", None)))
    assert got == expected and expected[("x_seconds_count", None)] == 13


async def test_steps_while_the_loop_is_busy_go_out_in_one_hand_off_and_join(runtime, tiny_models_root):  # noqa: F811
    """Decode steps that run while the event loop is busy leave one wake-up pending, not one per step;
    the loop then delivers them all and a lagging stream joins its queued chunks into the same tokens."""
    alone_model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    alone = [await generate(alone_model, p, max_new_tokens=20) for p in ("Once upon a time", "The cat")]
    await alone_model.stop()
    model_dir = load_model_dir(tiny_models_root / "tiny-gpt")
    model = GenerationModel(
        model_dir.manifest, *_sessions(GenerationModel, runtime, model_dir), runtime.settings, runtime, "fp32"
    )  # not started: driven here
    sched, loop = model.scheduler, asyncio.get_running_loop()
    handles = [model.submit(p, SamplingParams(max_new_tokens=20)) for p in ("Once upon a time", "The cat")]
    sched._deliver(sched._prefill(sched._admit()))
    wakeups = []
    real = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a: wakeups.append(a) or real(*a)
    try:
        sched._decode_slice(loop)  # here on the loop thread: the loop cannot drain until it returns
    finally:
        del loop.call_soon_threadsafe
    assert len(wakeups) == 1 and len(sched._outbox) == 19 and not sched.running
    await asyncio.sleep(0)
    assert not sched._outbox
    for handle, expected in zip(handles, alone, strict=True):
        chunks = [await handle.__anext__(), *handle.ready()]
        assert chunks[-1].finish_reason is not None
        assert [t for c in chunks for t in c.token_ids] == expected


def test_rows_that_left_before_a_failed_step_are_still_counted_out(runtime, tiny_models_root):  # noqa: F811
    from prometheus_client import REGISTRY

    model_dir = load_model_dir(tiny_models_root / "tiny-gpt")
    model = GenerationModel(
        model_dir.manifest, *_sessions(GenerationModel, runtime, model_dir), runtime.settings, runtime, "fp32"
    )  # not started: driven here
    sched = model.scheduler
    a = model.submit("Once upon a time", SamplingParams(max_new_tokens=20))
    model.submit("The cat", SamplingParams(max_new_tokens=20))
    sched._deliver(sched._prefill(sched._admit()))
    a.cancel()

    def failing_step(tokens):
        raise RuntimeError("injected step failure")

    sched.cache.step = failing_step
    with pytest.raises(RuntimeError):
        sched._decode()
    sched._drain()
    assert a.sequence.counted_out
    assert REGISTRY.get_sample_value("ts_generations_in_flight", {"model": model.name}) == 1
