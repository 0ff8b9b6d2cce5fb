"""Tool-call parsing of "auto" replies in each family's format (service/generation/tools.py), the
parser picked from the real templates' text; a reply that does not parse stays content."""

from __future__ import annotations

import json

import pytest

from service.generation import tools
from service.settings import TOOL_PARSERS
from tests.export.convert.chat_checkpoints import template

AUTO = tools.ToolChoice("auto")
ARGS = {"city": "Zürich", "unit": "c"}
CALL = json.dumps({"name": "get_weather", "arguments": ARGS})


@pytest.mark.parametrize(
    ("name", "parser"),
    [("qwen2.5", "hermes"), ("qwen3", "hermes"), ("llama-3.1", "llama3_json"), ("mistral-nemo", "mistral")],
)
def test_the_parser_comes_from_the_template(name, parser):
    assert tools.parser_of(template(name)) == parser


@pytest.mark.parametrize(
    ("parser", "reply", "content"),
    [
        (
            "hermes",
            f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {json.dumps(ARGS)}}}\n</tool_call>',
            "Let me check.",
        ),
        ("llama3_json", f'{{"name": "get_weather", "parameters": {json.dumps(ARGS)}}}', None),
        ("llama3_json", f'<|python_tag|>{{"name": "get_weather", "parameters": {json.dumps(ARGS)}}}', None),
        ("mistral", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {json.dumps(ARGS)}}}]', None),
        ("mistral", f'[{{"name": "get_weather", "arguments": {json.dumps(ARGS)}}}]', None),  # marker decoded away
    ],
)
def test_auto_replies_parse_into_tool_calls(parser, reply, content):
    got_content, calls = tools.parse(AUTO, parser, reply)
    assert got_content == content
    (call,) = calls
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == ARGS
    assert len(call["id"]) == 9 if parser == "mistral" else call["id"].startswith("call_")


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral", None])
@pytest.mark.parametrize("reply", ["It is sunny.", "<tool_call>{not json}</tool_call>", '{"name": 3}', "[1, 2]"])
def test_replies_that_do_not_parse_stay_content(parser, reply):
    assert tools.parse(AUTO, parser, reply) == (reply, [])


def test_none_never_parses_and_a_cut_constrained_reply_is_content():
    reply = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert tools.parse(tools.ToolChoice("none"), "hermes", reply) == (reply, [])
    assert tools.parse(tools.ToolChoice("named", "get_weather"), "hermes", '{"city": "Zü') == ('{"city": "Zü', [])


def test_the_settings_name_every_parser():
    assert set(tools.PARSERS) == set(TOOL_PARSERS)


@pytest.mark.parametrize(
    "reply",
    [
        f"Let me check.\n<tool_call>{CALL}</tool_call>\n<tool_call>{CALL}</tool_call>",
        f"<tool_call>{{not json}}</tool_call><tool_call>{CALL}</tool_call> trailing",
        "<tool_call>{not json}</tool_call> no call",
        "It is sunny.",
    ],
)
def test_a_call_streams_once_closed_and_the_stream_adds_up_to_the_whole_parse(reply):
    """Fed a character at a time, each call comes out at the character closing its `</tool_call>`;
    the content (with the first call) and the calls at the end add up to `parse` of the whole reply."""
    stream, content, calls = tools.CallStream(AUTO, "hermes"), None, []
    for i in range(len(reply)):
        said, new = stream.feed(reply[i])
        if new:
            assert reply[: i + 1].endswith("</tool_call>")
            content = said if not calls else content
        calls += new
    rest_content, rest = stream.finish()
    content = content if calls else rest_content
    whole_content, whole_calls = tools.parse(AUTO, "hermes", reply)
    assert content == whole_content and not rest
    assert [c["function"] for c in calls] == [c["function"] for c in whole_calls]
