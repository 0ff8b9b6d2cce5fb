"""OpenAI completions that score (echo + logprobs), token-id prompts, n > 1, vLLM's tokenizer routes,
against the real openai SDK and httpx on a real server; the reference for every log-probability is
the served decoder graph run directly in onnxruntime, teacher-forced over the same tokens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2 as httpx
import numpy as np
import openai
import pytest

from client import generate_request
from export.gate.parity import forced_logits, log_softmax, onnx_step, session
from service.generation.decoding import SamplingParams
from tests.fixtures.server import metric, until
from tests.service.embedding.test_service_batching import BlockedExecutor

SENTENCE = "Once upon a time, a cat sat on the mat."
MODEL = "tiny-gpt"


@pytest.fixture
async def client(server):
    """The openai SDK on the server's HTTP port, closed after the test (no retries: they would hide a status)."""
    async with openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def reference(server, ids: list[int]) -> np.ndarray:
    """log-softmax (T-1, V) of the served graph's logits predicting ids[1:], straight from onnxruntime."""
    model = server.server.registry.get("generation", MODEL)
    graph = Path(server.server.settings.models) / MODEL / model.manifest.graph("decoder", model.variant).file
    return log_softmax(forced_logits(onnx_step(session(graph), max_length=model.context), ids))


def token_names(server) -> list[str]:
    """Each token id's text as the completions show it."""
    tokenizer = server.server.registry.get("generation", MODEL).tokenizer
    return tokenizer.decode_batch([[t] for t in range(tokenizer.get_vocab_size())], skip_special_tokens=False)


async def tokenize(server, text: str, special: bool = True) -> list[int]:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post("/tokenize", json={"prompt": text, "add_special_tokens": special})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def check_offsets(text: str, logprobs) -> None:
    """Each token's text sits at its offset in the choice's text (special tokens are zero wide). Bytes of
    a character split over tokens (shown as U+FFFD) point at the character's start, and so does the
    token after an invalid byte run: both are skipped."""
    previous = ""
    for token, at in zip(logprobs.tokens, logprobs.text_offset, strict=True):
        if token != "<|endoftext|>" and "\ufffd" not in token + previous:
            assert text[at : at + len(token)] == token
        previous = token


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token-ids"])
async def test_echo_scores_a_sentence_as_onnxruntime_does(server, as_ids, client):
    ids = await tokenize(server, SENTENCE)
    assert ids[0] == 0 and len(ids) > 10  # the start token the tokenizer prepends, then the sentence
    ref = reference(server, ids)  # (T-1, V)
    reply = await client.completions.create(
        model=MODEL, prompt=ids if as_ids else SENTENCE, max_tokens=0, echo=True, logprobs=3, temperature=0
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert choice.text == SENTENCE and choice.finish_reason == "length"
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == len(ids) and lp.tokens[0] == "<|endoftext|>" and "".join(lp.tokens[1:]) == SENTENCE
    expected = ref[np.arange(len(ids) - 1), ids[1:]]
    assert np.allclose(lp.token_logprobs[1:], expected, atol=1e-4, rtol=0)
    names = token_names(server)
    for position, top in enumerate(lp.top_logprobs[1:]):
        # The 3 most likely tokens and the token itself, by their text (ids that decode alike share a key).
        expected_top = {}
        for t in [*np.argsort(-ref[position], kind="stable")[:3], ids[position + 1]]:
            expected_top.setdefault(names[t], ref[position, t])
        assert top.keys() == expected_top.keys()
        assert np.allclose([top[k] for k in expected_top], list(expected_top.values()), atol=1e-4, rtol=0)
    check_offsets(choice.text, lp)
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == 0


async def test_echo_with_new_tokens_scores_prompt_and_continuation(server, client):
    ids = await tokenize(server, SENTENCE)
    reply = await client.completions.create(
        model=MODEL, prompt=SENTENCE, max_tokens=6, echo=True, logprobs=1, temperature=0
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    new = len(lp.tokens) - len(ids)
    assert new == reply.usage.completion_tokens >= 1
    generated = await grpc_ids(server, SENTENCE, max_new_tokens=6)
    ref = reference(server, ids + generated)
    whole = ids + generated
    assert np.allclose(lp.token_logprobs[1:], ref[np.arange(len(whole) - 1), whole[1:]], atol=1e-4, rtol=0)
    for position in range(len(ids) - 1, len(whole) - 1):  # greedy: each new token is its position's top-1
        assert whole[position + 1] == int(ref[position].argmax())
        assert lp.token_logprobs[position + 1] == max(lp.top_logprobs[position + 1].values())
    assert choice.text.startswith(SENTENCE)
    check_offsets(choice.text, lp)


async def grpc_ids(server, prompt: str, **params) -> list[int]:
    """The tokens the gRPC door generates for the same request (the same seed gives the same tokens)."""
    return list((await server.generation.Generate(generate_request(prompt, model=MODEL, **params))).token_ids)


async def test_generated_tokens_logprobs_are_raw_and_offsets_follow_the_prompt(server, client):
    ids = await tokenize(server, SENTENCE)
    reply = await client.completions.create(
        model=MODEL, prompt=SENTENCE, max_tokens=8, logprobs=2, temperature=0.8, seed=3
    )
    lp = reply.choices[0].logprobs
    generated = await grpc_ids(server, SENTENCE, max_new_tokens=8, temperature=0.8, seed=3)
    assert len(generated) == reply.usage.completion_tokens == len(lp.token_logprobs)
    whole = ids + generated
    ref = reference(server, whole)[len(ids) - 1 :]  # raw log-softmax at the positions that chose them
    assert np.allclose(lp.token_logprobs, ref[np.arange(len(generated)), generated], atol=1e-4, rtol=0)
    assert lp.text_offset[0] == len(SENTENCE)  # offsets into prompt + completion, as OpenAI counts
    check_offsets(SENTENCE + reply.choices[0].text, lp)


async def test_n_choices_are_their_own_seed_streams(server, client):
    many = await client.completions.create(
        model=MODEL, prompt=["Once upon", "The dog"], n=3, max_tokens=10, temperature=1.0, seed=11
    )
    assert [c.index for c in many.choices] == list(range(6))
    completion_tokens = 0
    for c in many.choices:
        prompt, j = ["Once upon", "The dog"][c.index // 3], c.index % 3
        alone = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=1.0, seed=11 + j)
        assert c.text == alone.choices[0].text and c.finish_reason == alone.choices[0].finish_reason
        completion_tokens += alone.usage.completion_tokens
    prompts = len(await tokenize(server, "Once upon")) + len(await tokenize(server, "The dog"))
    assert many.usage.prompt_tokens == prompts and many.usage.completion_tokens == completion_tokens


async def test_token_id_prompts_generate_as_their_text(server, client):
    texts = ["Once upon a time", "A cat"]
    ids = [await tokenize(server, t) for t in texts]
    by_ids = await client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    for text, choice in zip(texts, by_ids.choices, strict=True):
        by_text = await client.completions.create(model=MODEL, prompt=text, max_tokens=12, temperature=0)
        assert choice.text == by_text.choices[0].text
    single = await client.completions.create(model=MODEL, prompt=ids[0], max_tokens=12, temperature=0)
    assert single.choices[0].text == by_ids.choices[0].text


async def test_lm_eval_reads_the_scores_as_it_expects(server):
    """lm-eval's local-completions parser on a reply to the request it sends (score context + continuation)."""
    lm_eval = pytest.importorskip("lm_eval.models.openai_completions")
    context, continuation = await tokenize(server, "Once upon a time,"), await tokenize(server, " a cat", special=False)
    whole = context + continuation
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": [whole],
                "max_tokens": 1,
                "logprobs": 1,
                "echo": True,
                "temperature": 0,
                "seed": 1234,
            },
        )
    assert reply.status_code == 200, reply.text
    ((total, greedy),) = lm_eval.LocalCompletionsAPI.parse_logprobs(reply.json(), [whole], [len(context)])
    ref = reference(server, whole)
    expected = ref[np.arange(len(context) - 1, len(whole) - 1), continuation]
    assert abs(total - float(expected.sum())) < 1e-4
    argmax = [int(ref[p].argmax()) for p in range(len(context) - 1, len(whole) - 1)]
    assert greedy == (argmax == continuation)


async def test_tokenize_detokenize_round_trip_and_tokenizer_info(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        plain = (
            await http.post(
                "/tokenize", json={"prompt": SENTENCE, "add_special_tokens": False, "return_token_strs": True}
            )
        ).json()
        special = (await http.post("/tokenize", json={"prompt": SENTENCE})).json()
        assert special["tokens"] == [0, *plain["tokens"]] and special["count"] == len(special["tokens"])
        assert special["token_strs"] is None and len(plain["token_strs"]) == plain["count"]
        assert special["max_model_len"] > 0
        back = (await http.post("/detokenize", json={"tokens": special["tokens"]})).json()
        assert back == {"prompt": SENTENCE}
        info = (await http.get("/tokenizer_info")).json()
        assert info["eos_token"] == info["bos_token"] == "<|endoftext|>" and info["model"] == MODEL
        bad = await http.post("/detokenize", json={"tokens": [1, 99999]})
        assert bad.status_code == 400 and "tokens[1]=99999" in bad.json()["error"]["message"]
        chat = await http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "chat template" in chat.json()["error"]["message"]


async def test_lm_eval_detects_the_remote_tokenizer(server):
    utils = pytest.importorskip("lm_eval.utils")
    url = server.http_url + "/v1/completions"

    def probe():  # lm-eval's own synchronous calls, in a thread: the server runs on this test's event loop
        remote = utils.RemoteTokenizer(url)
        return utils.check_remote_tokenizer_support(url), remote.eos_token_id, remote.decode(remote.encode(SENTENCE))

    assert await asyncio.to_thread(probe) == (True, 0, SENTENCE)


async def test_chat_completions_says_the_model_has_no_chat_template(server, client):
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 400 and "has no chat template" in err.value.message
    assert "--chat-template" in err.value.message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "hi", "logprobs": 6}, "logprobs"),
        ({"prompt": "hi", "n": 0}, "n"),
        ({"prompt": [0, 5, 300]}, "prompt[2]=300"),
        ({"prompt": [[0, 5], [7, -1]]}, "prompt[1][1]=-1"),
        ({"prompt": [[0, 5], []]}, "prompt[1]"),
        ({"prompt": ["a", 5]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": "hi", "n": 2, "stream": True}, "stream"),
        ({"prompt": "hi", "best_of": 3}, "best_of"),
    ],
    ids=["logprobs-6", "n-0", "id-out-of-vocab", "negative-id", "empty-ids", "mixed", "empty", "stream-n", "best-of"],
)
async def test_bad_values_are_400_naming_the_field(server, body, field):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post("/v1/completions", json={"model": MODEL, "max_tokens": 2, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "INVALID_ARGUMENT" and field in error["message"]


async def test_stream_with_echo_and_logprobs_equals_the_whole_reply(server, client):
    params = dict(model=MODEL, prompt=SENTENCE, max_tokens=10, echo=True, logprobs=2, temperature=0.7, seed=5)
    whole = (await client.completions.create(**params)).choices[0]
    events = [e async for e in await client.completions.create(stream=True, **params)]
    assert "".join(e.choices[0].text for e in events) == whole.text
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        streamed = [v for e in events if e.choices[0].logprobs for v in getattr(e.choices[0].logprobs, name)]
        assert streamed == getattr(whole.logprobs, name), name
    assert events[-1].choices[0].finish_reason == whole.finish_reason


async def test_scoring_takes_places_in_the_generation_queue(start_server):
    """Each choice is a generation in the model's queue: a request whose choices do not all fit is
    refused whole (429), the places it took given back; once the queue drains it is served."""
    srv = await start_server(compute_workers=1, gen_max_batch=1, gen_max_queue=2)
    model = srv.server.registry.get("generation", MODEL)
    body = {"model": MODEL, "prompt": [[0, 5, 6, 7], [0, 8, 9]], "max_tokens": 0, "echo": True, "logprobs": 1}
    async with BlockedExecutor(srv.server.runtime), httpx.AsyncClient(base_url=srv.http_url) as http:
        ahead = [model.submit("Once", SamplingParams(max_new_tokens=4)) for _ in range(2)]
        await until(lambda: metric("ts_queue_depth", {"model": MODEL}) == 1)  # one in the blocked turn, one waits
        refused = await http.post("/v1/completions", json=body)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "RESOURCE_EXHAUSTED"
    for handle in ahead:
        assert [c async for c in handle][-1].finish_reason is not None
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        served = await http.post("/v1/completions", json=body)
    assert served.status_code == 200, served.text
    for prompt, choice in zip(body["prompt"], served.json()["choices"], strict=True):
        ref = reference(srv, prompt)
        expected = ref[np.arange(len(prompt) - 1), prompt[1:]]
        assert np.allclose(choice["logprobs"]["token_logprobs"][1:], expected, atol=1e-4, rtol=0)


async def test_echo_with_n_choices_shares_the_prompt_scores(server, client):
    ids = await tokenize(server, SENTENCE)
    prompt_part = len(ids)
    many = await client.completions.create(
        model=MODEL, prompt=SENTENCE, n=3, max_tokens=4, echo=True, logprobs=1, temperature=1.0, seed=21
    )
    first = many.choices[0].logprobs
    for j, choice in enumerate(many.choices):
        alone = (
            await client.completions.create(
                model=MODEL, prompt=SENTENCE, max_tokens=4, echo=True, logprobs=1, temperature=1.0, seed=21 + j
            )
        ).choices[0]
        assert choice.text == alone.text and choice.logprobs.tokens == alone.logprobs.tokens
        assert choice.logprobs.token_logprobs[:prompt_part] == first.token_logprobs[:prompt_part]
        assert np.allclose(choice.logprobs.token_logprobs[1:], alone.logprobs.token_logprobs[1:], atol=1e-5, rtol=0)
    scored = await client.completions.create(
        model=MODEL, prompt=[ids, ids[:5]], n=2, max_tokens=0, echo=True, logprobs=0
    )
    assert [c.index for c in scored.choices] == [0, 1, 2, 3] and scored.usage.completion_tokens == 0
    assert scored.choices[0].logprobs == scored.choices[1].logprobs and scored.choices[2].text == scored.choices[3].text
    assert scored.usage.prompt_tokens == len(ids) + 5
    assert all(len(top) == 1 for top in scored.choices[0].logprobs.top_logprobs[1:])  # logprobs 0: the token alone
