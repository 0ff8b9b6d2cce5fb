"""Presence / frequency penalties, logit_bias and min_p (service/generation/penalties.py): what each
does to a row's tokens, that a row with them leaves its neighbours' tokens unchanged (in the sampler
and through a real server, seeded rows sent alone and beside an adjusted one), and their refusals."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import numpy as np
import openai
import pytest

from service.generation.decoding import SamplingParams, make_rng
from service.generation.sampler import Row, choose_tokens

V = 50


def row(seed: int | None = None, counts=None, **params) -> Row:
    p = SamplingParams(**params)
    return Row(p, np.zeros(0, np.int64), None if p.greedy else make_rng(seed), counts=dict(counts or {}))


def test_each_adjustment_moves_its_row_alone():
    logits = np.random.default_rng(0).normal(size=(4, V)).astype(np.float32)
    top = int(np.argmax(logits[0]))
    plain = choose_tokens(logits, [row(), row(), row(), row()])
    adjusted = choose_tokens(
        logits,
        [
            row(counts={top: 1}, presence_penalty=2.0, frequency_penalty=2.0),  # the top token pushed down
            row(logit_bias=((7, 100.0),)),  # token 7 forced
            row(),
            row(logit_bias=((int(np.argmax(logits[3])), -100.0),)),  # the top token banned
        ],
    )
    assert adjusted[0] != top and adjusted[1] == 7 and adjusted[2] == plain[2]
    assert adjusted[3] != plain[3]


def test_min_p_one_keeps_only_the_likeliest_and_neighbours_keep_their_draws():
    logits = np.random.default_rng(1).normal(size=(3, V)).astype(np.float32)
    alone = choose_tokens(logits[1:], [row(5, temperature=1.0), row(6, temperature=1.0)])
    got = choose_tokens(logits, [row(4, temperature=1.0, min_p=1.0), row(5, temperature=1.0), row(6, temperature=1.0)])
    assert got[0] == int(np.argmax(logits[0])) and got[1:] == alone


@pytest.fixture
async def server(start_server, chat_models_root):
    return await start_server(chat_models_root)


async def test_through_the_server_an_adjusted_row_leaves_its_neighbours_unchanged(server):
    sdk = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)

    async def free(seed: int) -> str:
        reply = await sdk.completions.create(
            model="qwen2.5", prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=seed
        )
        return reply.choices[0].text

    alone = [await free(s) for s in range(3)]
    penalised = sdk.completions.create(
        model="qwen2.5", prompt="Once upon a time", max_tokens=12, frequency_penalty=2.0, presence_penalty=2.0
    )
    together = await asyncio.gather(penalised, *(free(s) for s in range(3)))
    assert list(together[1:]) == alone
    chat = await sdk.chat.completions.create(
        model="qwen2.5", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, logit_bias={"65": 100}
    )
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        forced = (await http.post("/detokenize", json={"model": "qwen2.5", "tokens": [65] * 4})).json()["prompt"]
    assert chat.choices[0].message.content == forced  # +100 on token 65 forces it every step


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2]"),
        ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2]"),
        ({"min_p": 1.5}, "min_p must be in [0, 1]"),
        ({"logit_bias": {"5": 101}}, "logit_bias[5]=101"),
        ({"logit_bias": {"x": 1}}, "logit_bias['x']"),
        ({"logit_bias": {"99999": 1}}, "logit_bias names token 99999"),
    ],
)
async def test_out_of_range_adjustments_are_400(body, says, server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for path, extra in (
            ("/v1/completions", {"prompt": "x"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
        ):
            reply = await http.post(path, json={"model": "qwen2.5", **extra, **body})
            assert reply.status_code == 400 and says in reply.json()["error"]["message"], reply.text
