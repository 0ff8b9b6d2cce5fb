"""Failures stay with the row that caused them: its neighbours in the batch finish as if alone.

A real tiny model and the real scheduler task; the failure is injected into one request's own
work (its tokenizer, its random generator) or into the graph call while one row is in the batch.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from service.errors import ServiceError
from service.generation.decoding import SamplingParams
from service.generation.model import GenerationModel
from service.generation.sequence import Sequence
from service.runtime import Runtime
from service.settings import Settings
from tests.service.generation.test_engine import PROMPTS, generate, load

LENGTHS = [12, 30, 9, 25, 16, 20]


@pytest.fixture
async def model(tiny_models_root: Path):
    runtime = Runtime(Settings.from_env(env={}, models=str(tiny_models_root), variant="fp32", gen_max_batch=8))
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    yield model
    await model.stop()
    runtime.close()


class FailingTokenizer:
    """The model's tokenizer, whose decode raises from its `after`-th call on."""

    def __init__(self, tokenizer, after: int):
        self._tok, self._calls, self._after = tokenizer, 0, after

    def decode(self, ids, skip_special_tokens=True):
        self._calls += 1
        if self._calls >= self._after:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


class FailingGenerator:
    def random(self):
        raise FloatingPointError("injected")


def in_flight(model: GenerationModel) -> float:
    return REGISTRY.get_sample_value("ts_generations_in_flight", {"model": model.name})


def submit_sequence(model: GenerationModel, prompt: str, tokenizer=None, **params):
    ids = model.tokenizer.encode(prompt).ids
    seq = Sequence(ids, SamplingParams(**params), model.eos_ids, tokenizer or model.tokenizer)
    return model.scheduler.submit(seq)


async def failure_of(handle) -> ServiceError:
    with pytest.raises(ServiceError) as info:
        async for _ in handle:
            pass
    return info.value


async def test_a_row_whose_text_or_sampling_fails_fails_alone(model):
    alone = [await generate(model, p, max_new_tokens=n) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    text_fails = submit_sequence(
        model, "Once upon a time", FailingTokenizer(model.tokenizer, after=7), max_new_tokens=30
    )
    sampling_fails = submit_sequence(model, "The cat", max_new_tokens=30, temperature=0.8)
    sampling_fails.sequence.sampling.rng = FailingGenerator()
    crowd = await asyncio.gather(
        *(generate(model, p, max_new_tokens=n) for p, n in zip(PROMPTS, LENGTHS, strict=True)),
        failure_of(text_fails),
        failure_of(sampling_fails),
    )
    assert list(crowd[: len(PROMPTS)]) == alone
    text_error, sampling_error = crowd[len(PROMPTS) :]
    assert text_error.code == grpc.StatusCode.INTERNAL and "other requests were not affected" in text_error.message
    assert sampling_error.code == grpc.StatusCode.INVALID_ARGUMENT and "temperature=0.8" in sampling_error.message
    await asyncio.sleep(0.05)  # the failed rows are counted out at the next delivery
    assert model.scheduler.idle and model.scheduler.cache.rows == 0 and in_flight(model) == 0


async def test_a_failed_graph_step_is_retried_and_the_row_that_breaks_it_fails_alone(model):
    """The graph raises whenever one poison row is in the batch: its neighbours are re-prefilled from
    their tokens so far and end with the tokens they get alone; the poison row fails by itself."""
    alone = [await generate(model, p, max_new_tokens=n) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    sched, cache = model.scheduler, model.scheduler.cache
    sched.prefix.enabled = False  # every re-prefill goes through cache.prefill, counted below
    poison = submit_sequence(model, "Tom", max_new_tokens=30)
    real_prefill, real_step = cache.prefill, cache.step
    calls = {"prefill": 0, "step": 0}

    def prefill(prompts, every_position=False):
        calls["prefill"] += 1
        if poison.sequence.cache_ids in prompts and poison.sequence.retried:
            raise RuntimeError("injected prefill failure")
        return real_prefill(prompts, every_position=every_position)

    def step(tokens):
        calls["step"] += 1
        if any(s is poison.sequence for s in sched.running) and len(poison.sequence.generated) >= 3:
            raise RuntimeError("injected step failure")
        return real_step(tokens)

    cache.prefill, cache.step = prefill, step
    crowd = await asyncio.gather(
        *(generate(model, p, max_new_tokens=n) for p, n in zip(PROMPTS, LENGTHS, strict=True)), failure_of(poison)
    )
    assert list(crowd[: len(PROMPTS)]) == alone
    assert crowd[-1].code == grpc.StatusCode.INTERNAL and "failed twice" in crowd[-1].message
    assert calls["prefill"] >= 1 + len(PROMPTS) + 1  # then each row of the failed step alone, poison included
    await asyncio.sleep(0.05)
    assert sched.idle and cache.rows == 0 and in_flight(model) == 0


class MarkedTokenizer:
    """The served tokenizer, whose decode raises on any ids holding `marker` (one request's prompt)."""

    def __init__(self, tokenizer, marker: int):
        self._tok, self._marker = tokenizer, marker

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def decode(self, ids, skip_special_tokens=True):
        if self._marker in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


async def test_over_grpc_the_failing_call_gets_its_status_and_the_others_their_text(server):
    """Through a real server: the call whose text fails ends INTERNAL with a message saying so; the
    concurrent calls sharing its decoding steps return the same text as alone."""
    from service.proto import inference_pb2 as pb

    model = server.server.registry.get("generation")
    stub = server.generation
    prompts = ["Once upon a time", "The cat", "Tom and Sue"]
    alone = [(await stub.Generate(pb.GenerateRequest(prompt=p, max_new_tokens=20))).text for p in prompts]
    poison = "A prompt ending in \u00a7"
    model.tokenizer = MarkedTokenizer(model.tokenizer, model.tokenizer.encode(poison).ids[-1])
    assert all(model.tokenizer._marker not in model.tokenizer.encode(p).ids for p in prompts)

    async def poisoned() -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.GenerateStream(pb.GenerateRequest(prompt=poison, max_new_tokens=20)):
                pass
        return info.value

    results = await asyncio.gather(
        poisoned(), *(stub.Generate(pb.GenerateRequest(prompt=p, max_new_tokens=20)) for p in prompts)
    )
    error, texts = results[0], [r.text for r in results[1:]]
    assert error.code() == grpc.StatusCode.INTERNAL and "other requests were not affected" in error.details()
    assert texts == alone
