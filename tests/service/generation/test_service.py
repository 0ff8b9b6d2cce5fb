"""GenerationService and TranslationService over a real server (tiny-gpt, tiny-translate)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from client import AsyncClient, generate_request
from service.proto import inference_pb2 as pb
from tests.fixtures.server import generate_stream, metric

PROMPTS = ["Once upon a time", "The cat", "Hi", "Tom and Sue went", "A dog", "é ü", "Sam", "One day, a little"]


async def test_stream_and_unary_give_the_same_text(server):
    unary = await server.generation.Generate(generate_request("Once upon a time", max_new_tokens=40))
    chunks = await generate_stream(server, "Once upon a time", max_new_tokens=40)
    assert "".join(c.text for c in chunks) == unary.text
    assert [t for c in chunks for t in c.token_ids] == list(unary.token_ids)
    assert all(c.finish_reason == pb.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == unary.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert last.usage.output_tokens == len(unary.token_ids) and last.usage.input_tokens > 0
    assert last.timings.total_ms >= last.timings.time_to_first_token_ms > 0
    assert unary.model == "tiny-gpt"


async def test_max_new_tokens_is_capped_by_the_model(server):
    response = await server.generation.Generate(generate_request("Hi", max_new_tokens=100_000))
    info = await server.models.GetModel(pb.GetModelRequest(name="tiny-gpt"))
    assert response.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS)
    assert len(response.token_ids) <= info.max_output_tokens


async def test_same_seed_same_text(server):
    params = dict(max_new_tokens=30, temperature=1.0, top_p=0.9, top_k=40, seed=7)
    a, b = await asyncio.gather(*(server.generation.Generate(generate_request("Once", **params)) for _ in range(2)))
    c = await server.generation.Generate(generate_request("Once", **{**params, "seed": 8}))
    assert a.token_ids == b.token_ids and a.text == b.text
    assert c.token_ids != a.token_ids


async def test_stop_sequence_is_cut_in_unary_and_stream(server):
    full = await server.generation.Generate(generate_request("Once upon a time", max_new_tokens=40))
    assert len(full.text) > 12
    stop = full.text[8:11]
    expected = full.text[: full.text.find(stop)]
    request = generate_request("Once upon a time", max_new_tokens=40, stop=[stop, "\x00zz"])
    cut = await server.generation.Generate(request)
    assert cut.text == expected and cut.finish_reason == pb.FINISH_REASON_STOP_SEQUENCE
    chunks = await generate_stream(server, "Once upon a time", max_new_tokens=40, stop=[stop])
    assert "".join(c.text for c in chunks) == expected
    assert chunks[-1].finish_reason == pb.FINISH_REASON_STOP_SEQUENCE


async def test_concurrent_greedy_streams_equal_each_alone(server):
    alone = [(await server.generation.Generate(generate_request(p, max_new_tokens=24))).token_ids for p in PROMPTS]
    crowd = await asyncio.gather(*(generate_stream(server, p, max_new_tokens=24) for p in PROMPTS))
    assert [[t for c in chunks for t in c.token_ids] for chunks in crowd] == [list(a) for a in alone]


async def test_cancelled_stream_frees_its_row(server):
    labels = {"model": "tiny-gpt"}
    ttft_before = metric("ts_time_to_first_token_seconds_count", labels)
    call = server.generation.GenerateStream(generate_request("Once upon a time", max_new_tokens=64))
    first = await call.read()
    assert first.token_ids
    call.cancel()
    for _ in range(500):
        if metric("ts_generations_in_flight", labels) == 0:
            break
        await asyncio.sleep(0.01)
    assert metric("ts_generations_in_flight", labels) == 0
    assert metric("ts_time_to_first_token_seconds_count", labels) > ttft_before
    scheduler = server.server.registry.get("generation", "tiny-gpt").scheduler
    assert scheduler.idle and scheduler.cache.rows == 0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=1.5), "top_p must be in [0, 1]"),
        (dict(repetition_penalty=-0.5), "repetition_penalty"),
        (dict(stop=[""]), "stop[0]"),
    ],
)
async def test_bad_sampling_values_are_invalid_argument(server, kwargs, needle):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.generation.Generate(generate_request("Hi", **kwargs))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()


async def test_prompt_too_long_and_unknown_model(server):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.generation.Generate(generate_request("x" * 500))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.generation.Generate(generate_request("Hi", model="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_translate_beam_one_equals_greedy_and_batches(server):
    sources = ["Hello world.", "The cat sleeps.", "Yes", "Where is the station?"]
    async with AsyncClient(server.address) as client:
        greedy = await client.translate(sources, max_length=20)
        beam1 = await client.translate(sources, beam_size=1, max_length=20)
        beam4 = await client.translate(sources, beam_size=4, max_length=20)
        each = await asyncio.gather(*(client.translate([s], max_length=20) for s in sources))
    assert [t.text for t in beam1.translations] == [t.text for t in greedy.translations]
    assert [r.translations[0].text for r in each] == [t.text for t in greedy.translations]
    assert len(beam4.translations) == 4 and greedy.model == "tiny-translate"
    assert greedy.usage.input_tokens > 0 and greedy.usage.output_tokens > 0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(inputs=[]), "inputs is empty"),
        (dict(inputs=["a"], beam_size=99), "beam_size"),
        (dict(inputs=["a"], length_penalty=-1.0), "length_penalty"),
        (dict(inputs=["x" * 500]), "tokens"),
        (dict(inputs=["a"], beam_size=4, length_penalty=1e9), "length_penalty must be in [0, 10]"),
    ],
)
async def test_bad_translate_requests_are_invalid_argument(server, kwargs, needle):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.translation.Translate(pb.TranslateRequest(**kwargs))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()
