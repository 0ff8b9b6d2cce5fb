"""The generation core's tokenizer answers (tokenize, detokenize, tokenizer_info) and its scores are
plain values: the HTTP door formats /tokenize and OpenAI's logprobs without the model's tokenizer,
and every tokenize call is bounded (characters, the reply's size) like every other tokenization."""

from __future__ import annotations

import pickle

import httpx2 as httpx

from service.generation.core import GenerateQuery
from service.generation.decoding import SamplingParams
from service.generation.tokens import TOKENIZE_MAX_CHARS

MODEL = "tiny-gpt"
SENTENCE = "Once upon a time, a cat sat on the mat."


async def test_tokenize_refuses_a_text_over_its_character_limit_with_or_without_special_tokens(server):
    huge = "a" * (TOKENIZE_MAX_CHARS + 1)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for special in (True, False):
            reply = await http.post("/tokenize", json={"prompt": huge, "add_special_tokens": special})
            assert reply.status_code == 400 and reply.json()["error"]["code"] == "INVALID_ARGUMENT"
            assert f"at most {TOKENIZE_MAX_CHARS} characters" in reply.json()["error"]["message"]
        fits = await http.post("/tokenize", json={"prompt": "a " * 3000, "add_special_tokens": False})
        assert fits.status_code == 200 and fits.json()["count"] == len(fits.json()["tokens"]) > 1000


async def test_a_tokenize_reply_over_the_message_limit_is_400(start_server):
    srv = await start_server(max_message_bytes=8192)
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        body = {"prompt": "7 " * 3000, "return_token_strs": True}  # a 6 kB body, some 3000 tokens back
        reply = await http.post("/tokenize", json=body)
        assert reply.status_code == 400 and "max_message_bytes" in reply.json()["error"]["message"]
        small = await http.post("/tokenize", json={"prompt": SENTENCE})
        assert small.status_code == 200


async def test_scores_carry_their_token_texts_widths_and_offsets_as_plain_values(server):
    """A generation's chunk with echo and logprobs: the prompt's scores, then the generated tokens',
    each with its text (special tokens spelled out), the characters it adds and its offset in the
    text, computed in the core; they pickle."""
    core = server.server.cores.generation
    tokenizer = server.server.registry.get("generation", MODEL).tokenizer
    params = SamplingParams(max_new_tokens=6, logprobs=2)
    (generation,) = await core.generate_many([GenerateQuery(SENTENCE, params, MODEL, echo=True)])
    try:
        (chunk,) = await generation.collect()
    finally:
        generation.cancel()
    chunk = pickle.loads(pickle.dumps(chunk))
    scores = chunk.logprobs
    assert scores is not None and chunk.prompt_logprobs is None  # the prompt's scores come first in logprobs
    prompt = len(scores) - len(chunk.token_ids)
    assert scores.token_ids[prompt:] == chunk.token_ids and scores.logprobs[0] is None
    assert scores.tokens == tokenizer.decode_batch([[t] for t in scores.token_ids], skip_special_tokens=False)
    assert sum(scores.widths[:prompt]) == len(SENTENCE) and scores.widths[0] == 0  # the start token is zero wide
    assert [len(row) for row in scores.top_tokens] == [0] + [2] * (len(scores) - 1)
    assert scores.offsets == [sum(scores.widths[:i]) for i in range(len(scores))]
    eos = len(scores) if chunk.finish_reason != "eos" else len(scores) - 1
    assert chunk.text.startswith(SENTENCE)
    assert sum(scores.widths[:eos]) == len(chunk.text) or chunk.finish_reason == "stop"
    tokenized = await core.tokenize(SENTENCE, MODEL, add_special_tokens=True)
    assert tokenized.ids == scores.token_ids[:prompt] and (await core.detokenize(tokenized.ids, MODEL)).text == SENTENCE
    assert pickle.loads(pickle.dumps(core.tokenizer_info(MODEL))).model == MODEL
