"""Prefix caching and prompt-lookup speculation through real servers (tiny-gpt): the same greedy
tokens with either on as with both off, the cached tokens in every door's usage, the metrics, and
kept rows never holding a request back."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import numpy as np
import onnxruntime as ort
import openai
import pytest

from client import generate_request
from service import tokenizing
from service.engine.graphio import GraphIO
from service.generation.cache import SlotCache
from service.generation.decoding import SamplingParams
from service.generation.prefix import MIN_TOKENS, PrefixCache
from service.generation.sequence import Sequence
from service.generation.speculate import NGRAMS, Lookup
from service.manifest import load_model_dir
from service.proto import inference_pb2 as pb
from tests.fixtures.server import metric

MODEL = {"model": "tiny-gpt"}
SHARED = [(37 * i + 11) % 240 + 5 for i in range(36)]  # a shared prompt of 36 token ids (vocabulary: 257)
QUESTIONS = [[101 + q, 7, 202 + q, 9, 33 + q, 11, 44 + q, 13] for q in range(4)]
QUOTE = [(13 * i) % 97 + 20 for i in range(12)] * 3  # a context the continuation may quote


def tokens_of(request) -> list[int]:
    return list(request.token_ids)


async def greedy(server, prompt: list[int], n: int = 24, **fields) -> pb.GenerateResponse:
    return await server.generation.Generate(generate_request(prompt, max_new_tokens=n, **fields))


async def test_prefix_cache_keeps_greedy_tokens_and_reports_cached_tokens(start_server):
    plain = await start_server(gen_prefix_cache=False)
    cached = await start_server()
    hits = metric("ts_prefix_cache_hits_total", MODEL)
    saved = metric("ts_prefix_cache_cached_tokens_total", MODEL)
    for question in QUESTIONS[:2]:  # the second finds the first's finished row kept
        a = await greedy(plain, SHARED + question)
        b = await greedy(cached, SHARED + question)
        assert tokens_of(a) == tokens_of(b) and a.text == b.text
        assert a.usage.cached_tokens == 0
    assert b.usage.cached_tokens >= len(SHARED) and b.usage.input_tokens == len(SHARED) + 8
    assert metric("ts_prefix_cache_hits_total", MODEL) > hits
    assert metric("ts_prefix_cache_cached_tokens_total", MODEL) >= saved + len(SHARED)
    info = await cached.models.GetModel(pb.GetModelRequest(name="tiny-gpt"))
    assert info.manifest["serving.prefix_speculation"].startswith("prefix cache on")


async def test_concurrent_requests_sharing_a_prefix_get_their_tokens_alone(start_server):
    plain = await start_server(gen_prefix_cache=False)
    cached = await start_server()
    alone = [tokens_of(await greedy(plain, SHARED + q)) for q in QUESTIONS]
    crowd = await asyncio.gather(*(greedy(cached, SHARED + q) for q in QUESTIONS))
    assert [tokens_of(r) for r in crowd] == alone
    assert sum(r.usage.cached_tokens >= len(SHARED) for r in crowd) >= len(QUESTIONS) - 1  # all but the first


async def test_kept_rows_give_way_to_live_requests(start_server):
    plain = await start_server(gen_prefix_cache=False, gen_max_batch=3)
    cached = await start_server(gen_max_batch=3)
    for q in QUESTIONS[:3]:  # three finished rows kept: every row of the cache
        await greedy(cached, [q[0], *SHARED, *q])
    others = [[q[2], *reversed(SHARED), *q] for q in QUESTIONS]  # no shared prefix with what is kept
    alone = [tokens_of(await greedy(plain, p)) for p in others]
    crowd = await asyncio.gather(*(greedy(cached, p) for p in others))
    assert [tokens_of(r) for r in crowd] == alone
    again = await greedy(cached, [QUESTIONS[3][0], *SHARED, *QUESTIONS[3]])  # a kept row may have been dropped
    assert tokens_of(again) == tokens_of(await greedy(plain, [QUESTIONS[3][0], *SHARED, *QUESTIONS[3]]))


async def test_http_usage_reports_cached_tokens(start_server):
    cached = await start_server()
    client = openai.AsyncOpenAI(base_url=cached.http_url + "/v1", api_key="unused", max_retries=0)
    first = await client.completions.create(model="tiny-gpt", prompt=SHARED + QUESTIONS[0], max_tokens=8)
    second = await client.completions.create(model="tiny-gpt", prompt=SHARED + QUESTIONS[1], max_tokens=8)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= len(SHARED)
    grpc_reply = await greedy(cached, SHARED + QUESTIONS[1], n=8)
    assert second.choices[0].text == grpc_reply.text


async def test_speculation_keeps_greedy_tokens_and_accepts_quoted_drafts(start_server):
    plain = await start_server(gen_speculate=False, gen_prefix_cache=False)
    fast = await start_server(gen_speculate=True, gen_prefix_cache=False)
    accepted = {**MODEL, "outcome": "accepted"}
    before = metric("ts_speculative_tokens_total", accepted)
    for prompt in (QUOTE, SHARED, [5, 6, 7]):
        a, b = await greedy(plain, prompt, n=60), await greedy(fast, prompt, n=60)
        assert tokens_of(a) == tokens_of(b) and a.text == b.text
    assert metric("ts_speculative_tokens_total", accepted) > before
    seeded = dict(temperature=0.9, top_p=0.9, seed=3)  # sampled rows never speculate: same draws
    a, b = await greedy(plain, QUOTE, n=40, **seeded), await greedy(fast, QUOTE, n=40, **seeded)
    assert tokens_of(a) == tokens_of(b)


async def test_per_request_switch_overrides_the_server(start_server):
    fast = await start_server(gen_speculate=True)
    drafted = {**MODEL, "outcome": "accepted"}, {**MODEL, "outcome": "rejected"}
    before = sum(metric("ts_speculative_tokens_total", labels) for labels in drafted)
    request = pb.GenerateRequest(prompt_token_ids=QUOTE, max_new_tokens=40, speculative=False)
    off = await fast.generation.Generate(request)
    assert sum(metric("ts_speculative_tokens_total", labels) for labels in drafted) == before
    async with httpx.AsyncClient(base_url=fast.http_url) as http:
        body = {"model": "tiny-gpt", "prompt": QUOTE, "max_tokens": 40, "speculative": True}
        reply = (await http.post("/v1/completions", json=body)).json()
        bad = await http.post("/v1/completions", json={**body, "speculative": "yes"})
    assert reply["choices"][0]["text"] == off.text
    assert sum(metric("ts_speculative_tokens_total", labels) for labels in drafted) > before
    assert bad.status_code == 400 and "speculative" in bad.text


def scan(tokens: list[int], k: int) -> list[int]:
    """The drafts' definition, by a scan of every token: up to k tokens that followed the latest
    earlier occurrence of the longest suffix (n in NGRAMS) found."""
    for n in NGRAMS:
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == tokens[-n:]]
        if len(tokens) > n and starts:
            return tokens[starts[-1] + n : starts[-1] + n + k]
    return []


def draft(tokens: list[int], k: int) -> list[int]:
    return Lookup().draft(tokens, [], k)


def test_draft_follows_the_latest_earlier_occurrence_of_the_longest_suffix():
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 1, 2, 3]
    assert draft(tokens, 2) == [4, 5]  # "1 2 3" last seen before at 5, followed by 4 5
    assert draft([1, 2, 3, 4, 8, 4], 3) == []  # only "4" recurs: no 3-token suffix seen before
    assert draft([1, 2, 3], 4) == []


def test_a_rows_lookup_drafts_what_a_whole_scan_does_as_the_row_grows():
    rng = np.random.default_rng(0)
    for _ in range(20):  # few distinct tokens, so suffixes recur, sometimes overlapping themselves
        prompt = rng.integers(0, 4, int(rng.integers(0, 12))).tolist()
        generated: list[int] = []
        lookup = Lookup()
        for _ in range(60):
            k = int(rng.integers(1, 17))
            assert lookup.draft(prompt, generated, k) == scan(prompt + generated, k)
            generated += rng.integers(0, 4, int(rng.integers(1, 4))).tolist()  # a pass may keep several


@pytest.mark.parametrize(("limit", "cache_on"), [(0.0, True), (-1.0, False)], ids=["steps-differ", "both-differ"])
async def test_a_graph_whose_passes_disagree_turns_the_features_off(start_server, monkeypatch, limit, cache_on):
    """check_passes at load: a limit under this graph's drift between a pass and decode steps (about
    1e-6 here; the row-wise int8 tinystories-gpt's is 0.1) turns speculation off; one under its drift
    between a continued and a whole prefill (0.0 here, as on every graph measured) the prefix cache
    too, whatever the settings and the request say."""
    monkeypatch.setattr("service.generation.model.DRIFT_LIMIT", limit)
    strict = await start_server(gen_speculate=True)
    info = await strict.models.GetModel(pb.GetModelRequest(name="tiny-gpt"))
    features = info.manifest["serving.prefix_speculation"]
    assert features.startswith("prefix cache on;" if cache_on else "prefix cache off (a continued pass differs")
    assert "speculation off (a pass differs from decode steps by" in features
    drafted = {**MODEL, "outcome": "accepted"}, {**MODEL, "outcome": "rejected"}
    before = sum(metric("ts_speculative_tokens_total", labels) for labels in drafted)
    await greedy(strict, SHARED + QUESTIONS[0])
    again = await greedy(strict, SHARED + QUESTIONS[1], speculative=True)
    assert (again.usage.cached_tokens >= len(SHARED)) == cache_on
    assert sum(metric("ts_speculative_tokens_total", labels) for labels in drafted) == before


def test_random_arrivals_and_departures_keep_every_prefill_exact(tiny_models_root):
    """PrefixCache over a real tiny-gpt cache of 6 rows: rows leave (kept), newcomers arrive sharing
    stems with live rows, kept rows and each other; kept rows move, are dropped and are copied.
    Each newcomer's logits equal a whole prefill of its prompt on a cache of its own."""
    model_dir = load_model_dir(tiny_models_root / "tiny-gpt")
    manifest = model_dir.manifest
    session = ort.InferenceSession(str(model_dir.file(manifest.graph("decoder", "fp32").file)))
    io = GraphIO.inspect(session, manifest.architecture)
    tokenizer = tokenizing.load(model_dir.file(manifest.tokenizer["file"]))
    cache, alone = SlotCache(session, io, 6, 160), SlotCache(session, io, 1, 160)
    prefix = PrefixCache("tiny-gpt", cache, enabled=True)
    rng = np.random.default_rng(0)
    stems = [rng.integers(1, 250, 24).tolist() for _ in range(3)]
    running: list[Sequence] = []
    earlier: list[list[int]] = []
    hits = moved = 0
    for _ in range(60):
        leaving = set(rng.permutation(len(running))[: int(rng.integers(len(running) + 1))].tolist())
        for row in leaving:
            prefix.retain(row, running[row].cache_ids[: cache.lengths[row]])
        order = cache.keep([i for i in range(len(running)) if i not in leaving])
        running = [running[i] for i in order]
        room = cache.capacity - len(running)
        if not room:
            continue
        rows_before = {id(k): r for r, k in prefix.kept.items()}
        starts = [  # a stem's start, or an earlier prompt whole (a conversation's next turn)
            earlier[int(rng.integers(len(earlier)))] if earlier and rng.random() < 0.4 else stems[int(rng.integers(3))]
            for _ in range(int(rng.integers(1, min(room, 3) + 1)))
        ]
        prompts = [
            s[: int(rng.integers(9, 60))] + rng.integers(1, 250, int(rng.integers(1, 6))).tolist() for s in starts
        ]
        earlier += prompts
        seqs = [Sequence(p, SamplingParams(max_new_tokens=4), frozenset(), tokenizer) for p in prompts]
        prefix.make_room(len(seqs))  # as prefill does first (the least recently used kept rows go)
        sources = [running[r].cache_ids[: cache.lengths[r]] for r in range(len(running))]
        sources += [k.tokens.tolist() for k in prefix.kept.values()]
        ordered, last, _ = prefix.prefill(seqs, running)
        for i, seq in enumerate(seqs):  # the longest share with any source, compared with every one
            assert seq.cached_tokens == longest_share(seq.cache_ids, sources + prompts[:i])
        moved += any(rows_before.get(id(k), r) != r for r, k in prefix.kept.items())  # a kept row moved up
        for seq, logits in zip(ordered, last, strict=True):
            alone.reset()
            whole = alone.prefill([seq.cache_ids])[0]
            assert np.argmax(logits) == np.argmax(whole)
            np.testing.assert_allclose(logits, whole, atol=1e-4)
            hits += seq.cached_tokens > 0
        running += ordered
    assert hits > 10 and moved > 0


def longest_share(prompt: list[int], sources: list[list[int]]) -> int:
    """What prefix.py's plans are to find: the longest shared leading run with any source, leaving
    the last 2 prompt tokens to compute, and none when shorter than MIN_TOKENS."""
    best = 0
    for tokens in sources:
        n = next(
            (k for k, (a, b) in enumerate(zip(prompt, tokens, strict=False)) if a != b), min(len(prompt), len(tokens))
        )
        best = max(best, min(n, len(prompt) - 2))
    return best if best >= MIN_TOKENS else 0


async def test_chats_sharing_a_system_prompt_report_it_cached_at_both_doors(start_server, chat_models_root):
    plain = await start_server(chat_models_root, gen_prefix_cache=False)
    cached = await start_server(chat_models_root)
    system = {"role": "system", "content": "You are a careful assistant who answers in one short sentence. " * 3}
    turns = [[system, {"role": "user", "content": q}] for q in ("Hi there", "What is a cat?", "Name a colour")]
    for messages in turns[:2]:
        request = pb.ChatRequest(model="qwen3", max_new_tokens=8)
        request.messages.extend(pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages)
        a, b = await plain.generation.Chat(request), await cached.generation.Chat(request)
        assert a.choices[0].token_ids == b.choices[0].token_ids and a.usage.cached_tokens == 0
    assert b.usage.cached_tokens > 20  # the rendered system prompt, from the first chat's kept row
    sdk = openai.AsyncOpenAI(base_url=cached.http_url + "/v1", api_key="unused", max_retries=0)
    reply = await sdk.chat.completions.create(model="qwen3", messages=turns[2], max_tokens=8)
    assert reply.usage.prompt_tokens_details.cached_tokens > 20
