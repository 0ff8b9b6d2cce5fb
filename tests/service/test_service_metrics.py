"""Metrics scraped over HTTP from a real server and parsed with prometheus_client's parser."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import embed_request, generate_request, translate_request
from service.errors import DeadlineExceeded
from service.generation.decoding import SamplingParams
from service.proto import inference_pb2 as pb
from tests.fixtures.server import metric


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one /metrics scrape."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_series_move_after_calls(server):
    before = await asyncio.to_thread(scrape, server.metrics_url)
    for _ in range(3):
        await server.embedding.Embed(embed_request(["one", "two two"]))
    after = await asyncio.to_thread(scrape, server.metrics_url)
    ok = dict(service="EmbeddingService", method="Embed", model="tiny-embed", code="OK", protocol="grpc")
    assert value(after, "ts_requests_total", **ok) == value(before, "ts_requests_total", **ok) + 3
    latency = dict(service="EmbeddingService", method="Embed", model="tiny-embed", protocol="grpc")
    assert (
        value(after, "ts_request_duration_seconds_count", **latency)
        == value(before, "ts_request_duration_seconds_count", **latency) + 3
    )
    for name in (
        "ts_batch_size_count",
        "ts_batch_tokens_count",
        "ts_queue_duration_seconds_count",
        "ts_inference_duration_seconds_count",
    ):
        assert value(after, name, model="tiny-embed") > value(before, name, model="tiny-embed"), name
    tokens = dict(model="tiny-embed", direction="input")
    assert value(after, "ts_tokens_total", **tokens) > value(before, "ts_tokens_total", **tokens)
    served = await server.models.GetModel(pb.GetModelRequest(name="tiny-embed"))
    info = dict(
        model="tiny-embed",
        kind="embedding",
        provider="CPUExecutionProvider",
        variant=served.variant,
        requested_provider="CPUExecutionProvider",
    )
    assert value(after, "ts_model_info", **info) == 1
    assert value(after, "ts_queue_capacity", model="tiny-embed") == server.server.settings.embed_max_queue
    assert ("ts_queue_depth", frozenset({("model", "tiny-embed")})) in after


async def test_errors_counted_with_their_code(server):
    before = await asyncio.to_thread(scrape, server.metrics_url)
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError):
            await server.embedding.Embed(embed_request(["a"], model="missing"))
    after = await asyncio.to_thread(scrape, server.metrics_url)
    labels = dict(service="EmbeddingService", method="Embed", model="-", code="NOT_FOUND", protocol="grpc")
    assert value(after, "ts_requests_total", **labels) == value(before, "ts_requests_total", **labels) + 2


async def test_input_tokens_count_what_was_computed_for_every_kind(server):
    """ts_tokens_total{direction="input"} counts when the model computes, for every kind: a call adds its
    usage.input_tokens; a generation dropped while queued adds nothing (it was counted at submit)."""

    def read(model: str) -> float:
        return metric("ts_tokens_total", {"model": model, "direction": "input"})

    calls = {
        "tiny-embed": lambda: server.embedding.Embed(embed_request(["a few words here"])),
        "tiny-gpt": lambda: server.generation.Generate(generate_request("Once upon a time", max_new_tokens=2)),
        "tiny-translate": lambda: server.translation.Translate(translate_request(["Hello world.", "Yes"])),
    }
    for model, call in calls.items():
        before = read(model)
        reply = await call()
        assert reply.usage.input_tokens > 0
        assert read(model) - before == reply.usage.input_tokens, model
    generation = server.server.registry.get("generation")
    before = read("tiny-gpt")
    handle = generation.submit("Once upon a time", SamplingParams(max_new_tokens=4))  # no await: still queued
    generation.expire(handle, DeadlineExceeded("expired while queued (test)"))
    with pytest.raises(DeadlineExceeded):
        await handle.collect()
    assert read("tiny-gpt") == before
