"""Property test of the HTTP door: random JSON bodies for every POST route against a real server.

Bodies mix the routes' own field names with others, and values of every JSON type, including
what JSON allows and protobuf does not (NaN, huge integers, lone surrogate escapes). Each call
must end with a documented status (never 500) and an OpenAI-shaped, bounded error; a stream must
end with `data: [DONE]` or an error event. Seeded, so CI draws the same examples every time.
"""

from __future__ import annotations

import asyncio
import json

import httpx2 as httpx  # the HTTP client the openai SDK itself depends on
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from service.errors import MESSAGE_BYTES

FIELDS = {
    "/v1/embeddings": ["input", "model", "encoding_format", "dimensions", "user"],
    "/v1/completions": [
        "prompt",
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "seed",
        "stream",
        "n",
        "echo",
        "logprobs",
        "best_of",
        "repetition_penalty",
        "response_format",
        "structured_outputs",
    ],
    "/v1/chat/completions": [
        "model",
        "messages",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "chat_template_kwargs",
        "continue_final_message",
        "response_format",
        "structured_outputs",
    ],
    "/tokenize": ["prompt", "model", "add_special_tokens", "return_token_strs", "messages"],
    "/detokenize": ["tokens", "model"],
    "/v1/translate": ["inputs", "model", "beam_size", "max_length", "length_penalty"],
    "/v1/fill-mask": ["inputs", "model", "top_k"],
    "/rerank": ["query", "texts", "model", "raw_scores", "return_text", "truncate"],
    "/v1/rerank": ["query", "documents", "model", "top_n", "return_documents", "raw_scores"],
    "/v2/rerank": ["query", "documents", "model", "top_n", "return_documents", "truncate"],
    "/v1/score": ["text_1", "text_2", "model", "truncate"],
    "/predict": ["inputs", "model", "raw_scores", "truncate"],
    "/classify": ["input", "model", "raw_scores"],
    "/embed": ["inputs", "model", "normalize", "truncate", "dimensions", "prompt_name", "truncation_direction"],
    "/embed_sparse": ["inputs", "model", "truncate", "prompt_name", "truncation_direction"],
}
DOCUMENTED = {200, 400, 404, 429}
NO_USAGE = {"/tokenize", "/detokenize", "/rerank", "/predict", "/embed", "/embed_sparse"}  # vLLM's, TEI's: no usage
EXAMPLES = 150
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(0, 40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.just("\ud800")
    | st.sampled_from(
        [
            "tiny-embed",
            "tiny-gpt",
            "tiny-translate",
            "tiny-fill-mask",
            "bert-ce",
            "bert-cls3",
            "splade",
            "float",
            "base64",
            "",
            "a [MASK] b",
        ]
    )
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


MESSAGES = st.lists(  # chat messages: mostly well-formed keys, any values
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "tool_calls", "tool_call_id", "other"]),
        st.sampled_from(["system", "user", "assistant", "tool", "wizard"]) | VALUES,
        max_size=4,
    ),
    max_size=4,
)


@st.composite
def calls(draw, paths: tuple[str, ...] = ()):
    path = draw(st.sampled_from(sorted(paths or FIELDS)))
    body = draw(st.dictionaries(st.sampled_from([*FIELDS[path], "other"]), VALUES, max_size=6))
    if path != "/tokenize" and draw(st.booleans()):  # a structure llguidance may or may not take
        body["structured_outputs"] = {draw(st.sampled_from(["regex", "grammar", "json", "choice"])): draw(VALUES)}
    if path == "/v1/chat/completions" and draw(st.booleans()):
        body["messages"] = draw(MESSAGES)
        body["model"] = draw(st.sampled_from(["qwen2.5", "llama3.1", "mistral", "qwen3", "base", "tiny-gpt"]))
    return path, json.dumps(body)  # NaN and Infinity as JavaScript literals, which Python's json reads


def run_property(url: str, paths: tuple[str, ...] = ()) -> None:
    @seed(7)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(call=calls(paths))
    def ends_with_a_documented_status(call) -> None:
        path, body = call
        with httpx.Client(base_url=url, timeout=60) as http:
            reply = http.post(path, content=body, headers={"content-type": "application/json"})
        assert reply.status_code in DOCUMENTED, (path, body, reply.text[:300])
        if reply.status_code != 200:
            error = reply.json()["error"]
            assert {"message", "type", "code"} <= error.keys() and len(error["message"].encode()) <= MESSAGE_BYTES
        elif reply.headers["content-type"].startswith("text/event-stream"):
            assert reply.text.endswith("data: [DONE]\n\n") or '"error"' in reply.text.rsplit("data: ", 1)[-1]
        else:
            assert "usage" in reply.json() or path in NO_USAGE

    ends_with_a_documented_status()


async def test_random_bodies_never_get_a_500(all_kinds_root, start_server):
    server = await start_server(all_kinds_root)  # a model of every kind
    await asyncio.to_thread(run_property, server.http_url)
    async with httpx.AsyncClient(base_url=server.http_url) as http:  # still serving afterwards
        assert (await http.get("/health")).status_code == 200
        assert (await http.post("/v1/embeddings", json={"input": "fine"})).status_code == 200


async def test_random_chat_bodies_never_get_a_500(start_server, chat_models_root):
    server = await start_server(chat_models_root)  # chat models with templates (tests/fixtures/chat.py)
    await asyncio.to_thread(run_property, server.http_url, ("/v1/chat/completions", "/tokenize"))
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        body = {"model": "qwen2.5", "messages": [{"role": "user", "content": "still here?"}], "max_tokens": 2}
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
