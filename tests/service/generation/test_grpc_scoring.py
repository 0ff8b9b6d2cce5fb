"""GenerationService's n, echo, logprobs and token-id prompts: the same values as OpenAI's completions
on the same server (both doors call the generation core), a real grpc.aio stub against httpx; and
the gRPC refusals (INVALID_ARGUMENT naming the field).
"""

from __future__ import annotations

import grpc
import httpx2 as httpx
import pytest

from client import generate_request
from service.proto import inference_pb2 as pb
from tests.fixtures.server import generate_stream, status_of

SENTENCE = "Once upon a time, a cat sat on the mat."
MODEL = "tiny-gpt"


async def completion(server, **body) -> dict:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post("/v1/completions", json={"model": MODEL, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def as_openai(scores) -> dict | None:
    """gRPC TokenLogprobs in OpenAI's logprobs shape (top: the alternatives and the token, by text)."""
    if not scores:
        return None
    top: list[dict | None] = []
    for s in scores:
        if not s.HasField("logprob"):
            top.append(None)
            continue
        alternatives: dict[str, float] = {}
        for t in s.top:
            alternatives.setdefault(t.token, t.logprob)
        alternatives.setdefault(s.token, s.logprob)
        top.append(alternatives)
    return {
        "tokens": [s.token for s in scores],
        "token_logprobs": [s.logprob if s.HasField("logprob") else None for s in scores],
        "top_logprobs": top,
        "text_offset": [s.text_offset for s in scores],
    }


async def tokenize(server, text: str) -> list[int]:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        return (await http.post("/tokenize", json={"prompt": text})).json()["tokens"]


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token-ids"])
async def test_echo_scores_equal_the_openai_door(server, as_ids):
    prompt = await tokenize(server, SENTENCE) if as_ids else SENTENCE
    reply = await server.generation.Generate(
        generate_request(prompt, model=MODEL, max_new_tokens=0, echo=True, logprobs=3)
    )
    http = (await completion(server, prompt=prompt, max_tokens=0, echo=True, logprobs=3))["choices"][0]
    assert reply.text == http["text"] == SENTENCE and list(reply.token_ids) == []
    assert reply.finish_reason == pb.FINISH_REASON_LENGTH and http["finish_reason"] == "length"
    assert as_openai(reply.logprobs) == http["logprobs"]
    first = reply.logprobs[0]
    assert not first.HasField("logprob") and not first.top and first.text_offset == 0
    assert all(len(s.top) == 3 for s in reply.logprobs[1:])
    assert [s.token_id for s in reply.logprobs] == await tokenize(server, SENTENCE)
    assert reply.usage.input_tokens == len(reply.logprobs) and reply.usage.output_tokens == 0


@pytest.mark.parametrize("echo", [False, True])
async def test_sampled_tokens_and_scores_equal_the_openai_door_unary_and_streamed(server, echo):
    params = dict(max_new_tokens=10, temperature=0.8, seed=5, logprobs=2, echo=echo)
    reply = await server.generation.Generate(generate_request(SENTENCE, model=MODEL, **params))
    http = await completion(server, prompt=SENTENCE, max_tokens=10, temperature=0.8, seed=5, logprobs=2, echo=echo)
    choice = http["choices"][0]
    assert reply.text == choice["text"] and as_openai(reply.logprobs) == choice["logprobs"]
    assert reply.text.startswith(SENTENCE) == echo
    generated = reply.logprobs[len(reply.logprobs) - len(reply.token_ids) :]
    assert [s.token_id for s in generated] == list(reply.token_ids)
    assert generated[0].text_offset == len(SENTENCE)  # offsets count from the prompt's start, echo or not
    assert reply.usage.output_tokens == http["usage"]["completion_tokens"] == len(reply.token_ids) > 0
    chunks = await generate_stream(server, SENTENCE, model=MODEL, **params)
    assert "".join(c.text for c in chunks) == reply.text
    assert [s for c in chunks for s in c.logprobs] == list(reply.logprobs)


async def test_n_choices_equal_the_openai_door(server):
    params = dict(max_new_tokens=8, temperature=1.0, seed=11, logprobs=1)
    reply = await server.generation.Generate(generate_request("Once upon", model=MODEL, n=3, **params))
    http = await completion(server, prompt="Once upon", n=3, max_tokens=8, temperature=1.0, seed=11, logprobs=1)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    for ours, theirs in zip(reply.choices, http["choices"], strict=True):
        assert ours.text == theirs["text"] and as_openai(ours.logprobs) == theirs["logprobs"]
    assert (reply.text, list(reply.token_ids)) == (reply.choices[0].text, list(reply.choices[0].token_ids))
    assert len({c.text for c in reply.choices}) > 1  # each choice its own seed stream
    assert reply.usage.input_tokens == http["usage"]["prompt_tokens"]
    assert (
        reply.usage.output_tokens == http["usage"]["completion_tokens"] == sum(len(c.token_ids) for c in reply.choices)
    )
    alone = await server.generation.Generate(generate_request("Once upon", model=MODEL, **{**params, "seed": 13}))
    assert alone.text == reply.choices[2].text  # choice j samples with seed + j


async def test_echo_with_n_shares_the_prompt_scores_and_score_only_n_is_alike(server):
    reply = await server.generation.Generate(
        generate_request(SENTENCE, model=MODEL, n=2, max_new_tokens=4, temperature=1.0, seed=21, echo=True, logprobs=1)
    )
    http = await completion(server, prompt=SENTENCE, n=2, max_tokens=4, temperature=1.0, seed=21, echo=True, logprobs=1)
    for ours, theirs in zip(reply.choices, http["choices"], strict=True):
        assert ours.text == theirs["text"] and as_openai(ours.logprobs) == theirs["logprobs"]
    prompt = len(await tokenize(server, SENTENCE))
    assert list(reply.choices[0].logprobs)[:prompt] == list(reply.choices[1].logprobs)[:prompt]
    scored = await server.generation.Generate(
        generate_request(SENTENCE, model=MODEL, n=3, max_new_tokens=0, echo=True, logprobs=0)
    )
    assert len(scored.choices) == 3 and scored.choices[0].logprobs == scored.choices[2].logprobs
    assert scored.usage.output_tokens == 0 and all(not s.top for s in scored.logprobs)


async def test_token_id_prompts_generate_as_their_text(server):
    ids = await tokenize(server, "Once upon a time")
    by_ids = await server.generation.Generate(generate_request(ids, model=MODEL, max_new_tokens=12))
    by_text = await server.generation.Generate(generate_request("Once upon a time", model=MODEL, max_new_tokens=12))
    http = await completion(server, prompt=ids, max_tokens=12)
    assert by_ids.text == by_text.text == http["choices"][0]["text"] and by_ids.token_ids == by_text.token_ids
    assert by_ids.usage.input_tokens == len(ids)


BAD = {  # request, streamed, what the refusal says
    "logprobs-6": (generate_request("hi", model=MODEL, logprobs=6), False, "logprobs must be in [0, 5]"),
    "n-17": (generate_request("hi", model=MODEL, n=17), False, "n must be in [1, 16]"),
    "stream-n": (generate_request("hi", model=MODEL, n=2), True, "stream is supported for n=1"),
    "id-out-of-vocab": (generate_request([0, 5, 300], model=MODEL), False, "prompt_token_ids[2]=300"),
    "text-and-ids": (pb.GenerateRequest(prompt="hi", prompt_token_ids=[0, 5]), False, "not both"),
}


@pytest.mark.parametrize(("request_", "stream", "words"), BAD.values(), ids=BAD.keys())
async def test_bad_values_are_invalid_argument_naming_the_field(server, request_, stream, words):
    if stream:
        code, details = await status_of(_drain(server.generation.GenerateStream(request_)))
    else:
        code, details = await status_of(server.generation.Generate(request_))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and words in details, details


async def _drain(call) -> None:
    async for _ in call:
        pass


async def test_more_choices_than_the_queue_holds_is_invalid_argument(start_server):
    srv = await start_server(gen_max_queue=4)
    code, details = await status_of(srv.generation.Generate(generate_request("hi", model=MODEL, n=5, max_new_tokens=2)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs 5 places" in details and "split the call" in details
    fits = await srv.generation.Generate(generate_request("hi", model=MODEL, n=4, max_new_tokens=2))
    assert len(fits.choices) == 4
