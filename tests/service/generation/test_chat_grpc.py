"""GenerationService's Chat and ChatStream over a real gRPC server on the tiny chat checkpoints
(tests/fixtures/chat.py): the prompt is the template's (usage equals apply_chat_template's ids),
greedy Chat equals the OpenAI door's reply, the stream joins to it, tool calls and results reach
the template, and bad chats are INVALID_ARGUMENT / FAILED_PRECONDITION saying why."""

from __future__ import annotations

import copy
import json
import re

import grpc
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from export.convert.chat_template import CONVERSATIONS, WEATHER
from service.proto import inference_pb2 as pb
from tests.fixtures.server import status_of

pytestmark = pytest.mark.timeout(900)  # the first run converts the chat checkpoints (cached after)


def chat_request(messages: list[dict], tools=None, **fields) -> pb.ChatRequest:
    request = pb.ChatRequest(tools_json=json.dumps(tools) if tools else "", **fields)
    for m in messages:
        calls = [
            pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=json.dumps(c["function"]["arguments"]))
            for c in m.get("tool_calls", [])
        ]
        request.messages.append(
            pb.ChatMessage(
                role=m["role"], content=m["content"], tool_calls=calls, tool_call_id=m.get("tool_call_id", "")
            )
        )
    return request


def transformers_greedy(folder, ids: list[int]) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False, num_beams=1
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("model", ["qwen2.5", "llama3.1", "mistral", "qwen3"])
async def test_chat_equals_transformers_and_the_openai_door_and_streams_the_same(model, start_server, chat_models_root):
    """Greedy Chat's tokens are transformers' generate on apply_chat_template's ids."""
    server = await start_server(chat_models_root)
    tok = AutoTokenizer.from_pretrained(chat_models_root / "hf" / model)
    sdk = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    for _, messages, tools in CONVERSATIONS:
        ids = tok.apply_chat_template(
            copy.deepcopy(messages), tools=tools, add_generation_prompt=True, return_dict=False
        )
        request = chat_request(messages, tools, model=model, max_new_tokens=10)
        reply = await server.generation.Chat(request)
        assert reply.usage.input_tokens == len(ids) and reply.model == model and len(reply.choices) == 1
        assert list(reply.choices[0].token_ids) == transformers_greedy(chat_models_root / "hf" / model, ids)
        http = await sdk.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=10)
        assert reply.choices[0].content == http.choices[0].message.content
        chunks = [c async for c in server.generation.ChatStream(request)]
        assert "".join(c.content for c in chunks) == reply.choices[0].content
        assert [t for c in chunks for t in c.token_ids] == list(reply.choices[0].token_ids)
        assert chunks[-1].finish_reason == reply.choices[0].finish_reason != pb.FINISH_REASON_UNSPECIFIED
        counts = (chunks[-1].usage.input_tokens, chunks[-1].usage.output_tokens)
        assert counts == (reply.usage.input_tokens, reply.usage.output_tokens)  # cached_tokens: the repeat's hit


async def test_n_choices_share_one_prompt(start_server, chat_models_root):
    server = await start_server(chat_models_root)
    messages = [{"role": "user", "content": "Hi"}]
    request = chat_request(messages, model="qwen3", n=3, temperature=1.0, seed=3, max_new_tokens=6)
    reply = await server.generation.Chat(request)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.output_tokens == sum(len(c.token_ids) for c in reply.choices)
    again = await server.generation.Chat(request)  # seeded: the same choices again (its prompt now cached)
    assert again.choices == reply.choices and again.usage.output_tokens == reply.usage.output_tokens


@pytest.mark.parametrize(
    ("model", "request_", "code", "says"),
    [
        ("base", chat_request([{"role": "user", "content": "x"}]), grpc.StatusCode.FAILED_PRECONDITION, "template"),
        ("qwen2.5", chat_request([{"role": "tool", "content": "1"}]), grpc.StatusCode.INVALID_ARGUMENT, "tool_call_id"),
        ("qwen2.5", chat_request([]), grpc.StatusCode.INVALID_ARGUMENT, "messages is empty"),
        ("qwen2.5", pb.ChatRequest(tools_json="{"), grpc.StatusCode.INVALID_ARGUMENT, "tools_json"),
        (
            "qwen2.5",
            chat_request([{"role": "user", "content": "x"}], chat_template_kwargs_json="[1]"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "chat_template_kwargs_json",
        ),
        ("llama3.1", chat_request([{"role": "user", "content": "x"}], [WEATHER], n=2), None, None),
    ],
)
async def test_bad_chats_say_why(model, request_, code, says, start_server, chat_models_root):
    server = await start_server(chat_models_root)
    request_.model = model
    if code is None:  # ChatStream streams one choice
        code, says = grpc.StatusCode.INVALID_ARGUMENT, "n=1"
        got = await status_of(_drain(server.generation.ChatStream(request_)))
    else:
        got = await status_of(server.generation.Chat(request_))
    assert got[0] == code and says in got[1], got


async def _drain(stream) -> None:
    async for _ in stream:
        pass


async def test_structured_output_and_tool_calls_over_grpc(start_server, chat_models_root):
    server = await start_server(chat_models_root)
    messages = [{"role": "user", "content": "A code?"}]
    for seed in range(3):
        request = chat_request(messages, model="qwen2.5", temperature=1.0, seed=seed, max_new_tokens=20)
        request.structured_outputs_json = json.dumps({"regex": "[a-z]{2}-[0-9]{3}"})
        reply = await server.generation.Chat(request)
        assert re.fullmatch("[a-z]{2}-[0-9]{3}", reply.choices[0].content), reply.choices[0].content
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 3}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    request = chat_request(messages, [tool], model="qwen2.5", temperature=1.0, seed=1, max_new_tokens=60)
    request.tool_choice_json, request.parallel_tool_calls = '"required"', False
    reply = await server.generation.Chat(request)
    (call,) = reply.choices[0].tool_calls
    assert call.name == "get_weather" and len(json.loads(call.arguments)["city"]) <= 3 and call.id
    (chunk,) = [c async for c in server.generation.ChatStream(request)]
    assert chunk.tool_calls[0].arguments == call.arguments
    usage = chunk.usage
    assert (usage.input_tokens, usage.output_tokens) == (reply.usage.input_tokens, reply.usage.output_tokens)
    request.response_format_json = '{"type": "json_object"}'
    assert (await status_of(server.generation.Chat(request)))[0] == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_chat_bigger_than_the_queue_is_refused_before_rendering(start_server, tmp_path):
    """The queue is asked first: a template that would raise is never rendered for a refused call."""
    (tmp_path / "raises.jinja").write_text("{{ raise_exception('rendered') }}", encoding="utf-8")
    server = await start_server(chat_template=f"tiny-gpt={tmp_path / 'raises.jinja'}", gen_max_queue=2)
    request = chat_request([{"role": "user", "content": "hi"}], model="tiny-gpt", max_new_tokens=2)
    request.n = 3
    code, details = await status_of(server.generation.Chat(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs 3 places" in details and "rendered" not in details
    request.n = 1
    code, details = await status_of(server.generation.Chat(request))
    assert code != grpc.StatusCode.OK and "rendered" in details  # the template did raise when rendered
