"""Tool calls through the openai SDK on the tiny chat checkpoints: tool_choice "required" and a named
function constrain the reply (llguidance) so random weights still return calls whose arguments
validate against the tool's parameters; unary and streamed `tool_calls` in OpenAI's shape, finish
reason "tool_calls"; a call and its result fed back through each family's template; refusals."""

from __future__ import annotations

import json

import httpx2 as httpx
import jsonschema
import openai
import pytest

from export.convert.chat_template import WEATHER
from service.registry import ModelLoadError

pytestmark = pytest.mark.timeout(900)  # the first run converts the chat checkpoints (cached after)

MESSAGES = [{"role": "user", "content": "What is the weather in Zürich?"}]
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 3}},
            "additionalProperties": False,
        },
    },
}
PARAMS = {"get_weather": WEATHER["function"]["parameters"], "get_time": CLOCK["function"]["parameters"]}
LIMITED = {  # the weather tool with short strings: random weights finish a call within the 64 tokens served
    "type": "function",
    "function": {
        **WEATHER["function"],
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 3}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
async def client(start_server, chat_models_root):
    server = await start_server(chat_models_root)
    return openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0), server


def check_calls(calls, tools) -> None:
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])


@pytest.mark.parametrize("model", ["qwen2.5", "llama3.1", "mistral", "qwen3"])
async def test_required_and_named_calls_validate_and_go_back_through_the_template(model, client):
    sdk, _ = client
    tools = [LIMITED] if model == "llama3.1" else [LIMITED, CLOCK]  # Llama's indented tools fill its 1024 tokens
    for seed in range(3):
        reply = await sdk.chat.completions.create(
            model=model, messages=MESSAGES, tools=tools, tool_choice="required", temperature=1.0, seed=seed,
            max_tokens=64, parallel_tool_calls=False,
        )  # fmt: skip
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        check_calls(choice.message.tool_calls, tools)
    named = await sdk.chat.completions.create(
        model=model, messages=MESSAGES, tools=tools, temperature=1.0, seed=5, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    check_calls([call], tools)
    history = [
        *MESSAGES,
        named.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "name": "get_weather", "content": '{"temp": 21}'},
    ]
    after = await sdk.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=4)
    assert after.usage.prompt_tokens > named.usage.prompt_tokens


async def test_streamed_tool_calls_add_up_to_the_unary_ones(client):
    sdk, _ = client
    kwargs = dict(model="qwen2.5", messages=MESSAGES, tools=[LIMITED], tool_choice="required", seed=3, max_tokens=64)
    kwargs["parallel_tool_calls"] = False  # one call: random weights finish it within the 64 tokens served
    unary = await sdk.chat.completions.create(temperature=1.0, **kwargs)
    stream = await sdk.chat.completions.create(temperature=1.0, stream=True, **kwargs)
    events = [e async for e in stream]
    deltas = [c for e in events for d in [e.choices[0].delta] if d.tool_calls for c in d.tool_calls]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
        (i, c.function.name, c.function.arguments) for i, c in enumerate(unary.choices[0].message.tool_calls)
    ]
    assert events[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not one of"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice must be"),
        ({"tools": [{"type": "function", "function": {"name": 3}}]}, "tools[0]"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "constrains the reply",
        ),
    ],
)
async def test_bad_tool_requests_are_400(body, says, client):
    _, server = client
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post("/v1/chat/completions", json={"model": "qwen2.5", "messages": MESSAGES, **body})
    assert reply.status_code == 400 and says in reply.json()["error"]["message"], reply.text


async def test_the_servers_tool_parser_overrides_the_templates(start_server, chat_models_root):
    """qwen2.5's template picks Hermes' format; --tool-parser qwen2.5=mistral parses Mistral's instead. The
    reply is forced (a one-choice constraint) to a Mistral-format call: a call under the override, text without."""
    said = '[TOOL_CALLS][{"name": "get_time", "arguments": {"city": "Zü"}}]'
    body = dict(
        model="qwen2.5",
        messages=MESSAGES,
        tools=[CLOCK],
        max_tokens=64,
        extra_body={"structured_outputs": {"choice": [said]}},
    )
    mistral = await start_server(chat_models_root, tool_parser="qwen2.5=mistral")
    sdk = openai.AsyncOpenAI(base_url=mistral.http_url + "/v1", api_key="unused", max_retries=0)
    (choice,) = (await sdk.chat.completions.create(**body)).choices
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {"city": "Zü"})
    assert len(call.id) == 9 and choice.finish_reason == "tool_calls" and not choice.message.content
    hermes = await start_server(chat_models_root)
    sdk = openai.AsyncOpenAI(base_url=hermes.http_url + "/v1", api_key="unused", max_retries=0)
    (choice,) = (await sdk.chat.completions.create(**body)).choices
    assert choice.message.content == said and not choice.message.tool_calls and choice.finish_reason == "stop"


async def test_a_tool_parser_for_no_served_model_stops_the_start(start_server, chat_models_root):
    with pytest.raises(ModelLoadError, match="tool_parser names qwen9, not a generation model served here"):
        await start_server(chat_models_root, tool_parser="qwen9=hermes")


async def test_a_streamed_call_goes_out_once_complete(start_server, chat_models_root):
    """Under "auto" in Hermes' format, a `<tool_call>` goes out as a delta.tool_calls as soon as its
    `</tool_call>` is written, not at the stream's end; the stream adds up to the unary reply. The reply
    is forced (a regex): content, a call, then 20 more characters (the served 64 tokens hold no more).
    The Mistral checkpoint is told to parse Hermes' format: its tokenizer writes `<tool_call>` as plain
    text, where the tiny Qwen's has it as one added token after which llguidance's matcher fails; and
    compact JSON: after `:` the tiny Mistral's matcher fails on its ` "` token."""
    server = await start_server(chat_models_root, tool_parser="mistral=hermes")
    sdk = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    regex = r'ok<tool_call>\{"name":"get_time","arguments":\{"city":"Zü"\}\}</tool_call>[a-z]{20}'
    kwargs = dict(
        model="mistral",
        messages=MESSAGES,
        tools=[CLOCK],
        max_tokens=64,
        temperature=1.0,
        seed=5,
        extra_body={"structured_outputs": {"regex": regex}},
    )
    unary = (await sdk.chat.completions.create(**kwargs)).choices[0]
    events = [e async for e in await sdk.chat.completions.create(stream=True, **kwargs)]
    deltas = [e.choices[0].delta for e in events]
    streamed = [c for d in deltas if d.tool_calls for c in d.tool_calls]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in streamed] == [
        (0, "get_time", {"city": "Zü"})
    ]
    (call,) = unary.message.tool_calls
    assert (call.function.name, call.function.arguments) == (streamed[0].function.name, streamed[0].function.arguments)
    first = next(i for i, d in enumerate(deltas) if d.tool_calls)
    assert first < len(events) - 1 and deltas[first].content == unary.message.content == "ok"
    assert "".join(d.content or "" for d in deltas) == "ok"
    assert events[-1].choices[0].finish_reason == unary.finish_reason == "tool_calls"
