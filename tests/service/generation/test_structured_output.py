"""Structured output with llguidance through the openai SDK on a tiny random-weight chat model: JSON
schema outputs that validate for many seeds at temperature 1, in compact JSON; regex outputs that
fullmatch; choices; a constrained row beside unconstrained ones leaves theirs unchanged; a grammar
that cannot finish within max_tokens ends with "length"; what llguidance refuses is a 400 naming the
field. gRPC Generate / GenerateStream take the same structures (INVALID_ARGUMENT naming the field)."""

from __future__ import annotations

import asyncio
import json
import re

import grpc
import httpx2 as httpx
import jsonschema
import openai
import pytest

from service.proto import inference_pb2 as pb
from tests.fixtures.server import status_of

pytestmark = pytest.mark.timeout(900)  # the first run converts the chat checkpoints (cached after)

MODEL = "qwen2.5"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture
async def server(start_server, chat_models_root):
    return await start_server(chat_models_root)


def sdk(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


async def test_json_schema_outputs_validate_at_temperature_1(server):
    client = sdk(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=MODEL, messages=MESSAGES, response_format=fmt, temperature=1.0, seed=seed, max_tokens=80
            )
            for seed in range(12)
        )
    )
    texts = set()
    for reply in replies:
        text = reply.choices[0].message.content
        jsonschema.validate(json.loads(text), SCHEMA)
        assert reply.choices[0].finish_reason == "stop"
        assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)  # compact
        texts.add(text)
    assert len(texts) > 1  # sampled, not one forced answer


async def test_json_object_regex_and_choice(server):
    client = sdk(server)
    reply = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format={"type": "json_object"}, temperature=1.0, seed=1, max_tokens=60
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # a random model may fill an object past max_tokens; what it wrote is still an object's start
        assert reply.choices[0].message.content.startswith("{")
    for seed in range(6):
        plain = await client.completions.create(
            model=MODEL,
            prompt="Code:",
            max_tokens=20,
            temperature=1.0,
            seed=seed,
            extra_body={"structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}},
        )
        assert re.fullmatch("[a-z]{3}-[0-9]{2}", plain.choices[0].text), plain.choices[0].text
        picked = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            temperature=1.0,
            seed=seed,
            extra_body={"structured_outputs": {"choice": ["yes", "no", "perhaps"]}},
        )
        assert picked.choices[0].message.content in ("yes", "no", "perhaps")


async def test_a_constrained_row_leaves_its_neighbours_unchanged(server):
    client = sdk(server)

    async def free(seed: int) -> str:
        reply = await client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=seed
        )
        return reply.choices[0].text

    alone = [await free(seed) for seed in range(3)]
    constrained = client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=16,
        temperature=1.0,
        seed=0,
        extra_body={"structured_outputs": {"regex": "[0-9]+"}},
    )
    together = await asyncio.gather(constrained, *(free(seed) for seed in range(3)))
    assert list(together[1:]) == alone
    assert re.fullmatch("[0-9]+", together[0].choices[0].text)


async def test_a_grammar_that_cannot_finish_ends_with_length(server):
    reply = await sdk(server).completions.create(
        model=MODEL, prompt="x", max_tokens=5, extra_body={"structured_outputs": {"regex": "a{40}"}}
    )
    assert reply.choices[0].finish_reason == "length" and set(reply.choices[0].text) <= {"a"}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}, "json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "wat"}}}}, "schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "start: undefined_rule"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json": "{"}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
    ],
)
async def test_what_llguidance_refuses_is_400_naming_the_field(body, says, server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for path, extra in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "x"})):
            reply = await http.post(path, json={"model": MODEL, **extra, **body})
            assert reply.status_code == 400, reply.text
            assert says in reply.json()["error"]["message"]


async def test_grpc_generate_takes_structured_output(server):
    """GenerateRequest's response_format_json / structured_outputs_json constrain Generate and
    GenerateStream as ChatRequest's do: regex outputs fullmatch, schema outputs validate (seeds at
    temperature 1), every one of n choices too."""
    regex = "[a-z]{2}-[0-9]{3}"
    fmt = json.dumps({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    for seed in range(4):
        sampled = dict(model=MODEL, prompt="A code:", temperature=1.0, seed=seed)
        reply = await server.generation.Generate(
            pb.GenerateRequest(**sampled, max_new_tokens=20, structured_outputs_json=json.dumps({"regex": regex}))
        )
        assert re.fullmatch(regex, reply.text), reply.text
        reply = await server.generation.Generate(
            pb.GenerateRequest(**sampled, max_new_tokens=80, response_format_json=fmt)
        )
        jsonschema.validate(json.loads(reply.text), SCHEMA)
    request = pb.GenerateRequest(
        model=MODEL,
        prompt="x",
        temperature=1.0,
        seed=9,
        max_new_tokens=20,
        structured_outputs_json=json.dumps({"regex": regex}),
    )
    chunks = [c async for c in server.generation.GenerateStream(request)]
    assert re.fullmatch(regex, "".join(c.text for c in chunks))
    request.n = 3
    choices = (await server.generation.Generate(request)).choices
    assert len(choices) == 3 and all(re.fullmatch(regex, c.text) for c in choices)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"response_format_json": json.dumps({"type": "json_schema", "json_schema": {"schema": {"type": "wat"}}})},
            "response_format.json_schema.schema",
        ),
        ({"response_format_json": "{"}, "response_format_json is not JSON"),
        ({"structured_outputs_json": json.dumps({"regex": "("})}, "structured_outputs.regex"),
        ({"structured_outputs_json": "[]"}, "structured_outputs_json must be a JSON object"),
        ({"response_format_json": '{"type": "json_object"}', "structured_outputs_json": '{"regex": "a"}'}, "not both"),
    ],
)
async def test_bad_structures_on_grpc_generate_are_invalid_argument(fields, says, server):
    request = pb.GenerateRequest(model=MODEL, prompt="x", max_new_tokens=4, **fields)
    for call in (server.generation.Generate(request), _first(server.generation.GenerateStream(request))):
        code, message = await status_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and says in message, message


async def _first(stream):
    async for chunk in stream:
        return chunk
