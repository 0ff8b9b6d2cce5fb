"""`/v1/chat/completions` through the openai SDK on tiny chat checkpoints (tests/fixtures/chat.py):
the prompt is the checkpoint's template rendered and tokenized as transformers' apply_chat_template
does (usage.prompt_tokens, /tokenize with messages), greedy replies equal /v1/completions' on those
ids (test_chat_grpc.py holds the tokens to transformers' generate), streams join to the unary reply,
n choices, logprobs, reasoning, the server's --chat-template, and the refusals (no template, bad
messages, a template that raises, a prompt too long)."""

from __future__ import annotations

import copy

import httpx2 as httpx
import openai
import pytest
from transformers import AutoTokenizer

from export.convert.chat_template import CONVERSATIONS
from service.manifest import ModelDirError
from service.registry import ModelLoadError
from tests.export.convert.chat_checkpoints import template

NEW_TOKENS = 12
pytestmark = pytest.mark.timeout(900)  # the first run converts the chat checkpoints (cached after)
CHATS = ["qwen2.5", "llama3.1", "mistral", "qwen3"]


@pytest.fixture(scope="module")
def reference(chat_models_root):
    """name -> the Hugging Face folder's tokenizer."""
    return {n: AutoTokenizer.from_pretrained(chat_models_root / "hf" / n) for n in CHATS}


@pytest.fixture
async def chat_server(start_server, chat_models_root, tmp_path):
    file = tmp_path / "chatml.jinja"
    file.write_text(template("qwen2.5"), encoding="utf-8")
    return await start_server(chat_models_root, chat_template=f"base={file}")


def sdk(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("name", CHATS)
async def test_chat_prompts_are_the_templates_ids_and_replies_their_completion(name, chat_server, reference):
    """usage and /tokenize give apply_chat_template's ids; the greedy reply is /v1/completions' on
    those ids (gRPC's test holds the tokens to transformers' generate)."""
    client, tok = sdk(chat_server), reference[name]
    for _, messages, tools in CONVERSATIONS:
        ids = tok.apply_chat_template(
            copy.deepcopy(messages), tools=tools, add_generation_prompt=True, return_dict=False
        )
        reply = await client.chat.completions.create(
            model=name, messages=copy.deepcopy(messages), tools=tools, max_tokens=NEW_TOKENS, temperature=0
        )
        assert reply.usage.prompt_tokens == len(ids) and reply.object == "chat.completion"
        plain = await client.completions.create(model=name, prompt=list(ids), max_tokens=NEW_TOKENS, temperature=0)
        assert reply.choices[0].message.content == plain.choices[0].text
        assert reply.choices[0].message.role == "assistant"
        assert reply.choices[0].finish_reason == plain.choices[0].finish_reason
        async with httpx.AsyncClient(base_url=chat_server.http_url) as http:
            body = {"model": name, "messages": messages, "tools": tools}
            tokenized = (await http.post("/tokenize", json=body)).json()
        assert tokenized["tokens"] == list(ids)


async def test_stream_joins_to_the_reply_with_role_first_and_usage_last(chat_server):
    client = sdk(chat_server)
    messages = [{"role": "user", "content": "Tell me a story 🙂"}]
    unary = await client.chat.completions.create(model="qwen3", messages=messages, max_tokens=NEW_TOKENS)
    stream = await client.chat.completions.create(
        model="qwen3", messages=messages, max_tokens=NEW_TOKENS, stream=True, stream_options={"include_usage": True}
    )
    events = [e async for e in stream]
    assert events[0].choices[0].delta.role == "assistant"
    assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == unary.choices[0].message.content
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == unary.choices[0].finish_reason
    last = events[-1].usage
    assert events[-1].choices == [] and (last.prompt_tokens, last.completion_tokens) == (
        unary.usage.prompt_tokens,
        unary.usage.completion_tokens,
    )  # its prompt_tokens_details.cached_tokens: the repeat found the prompt cached
    assert all(e.usage is None for e in events[:-1]) and len({e.id for e in events}) == 1


async def test_n_choices_seeds_and_logprobs(chat_server):
    client = sdk(chat_server)
    messages = [{"role": "user", "content": "Hello!"}]
    kwargs = dict(model="qwen2.5", messages=messages, max_completion_tokens=8, temperature=1.0, seed=7)
    reply = await client.chat.completions.create(n=3, logprobs=True, top_logprobs=2, **kwargs)
    again = await client.chat.completions.create(n=3, logprobs=True, top_logprobs=2, **kwargs)
    assert [c.message.content for c in reply.choices] == [c.message.content for c in again.choices]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    total = 0
    for choice in reply.choices:
        content = choice.logprobs.content
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
        assert all(t.bytes == list(t.token.encode()) for t in content)
        total += len(content)
    assert reply.usage.completion_tokens == total


async def test_the_servers_chat_template_gives_a_base_model_one(chat_server, reference):
    client = sdk(chat_server)
    reply = await client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    tok = reference["qwen2.5"]  # the same tokenizer; base has no template of its own
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_dict=False)
    assert reply.usage.prompt_tokens == len(ids)


async def test_a_model_without_a_template_says_how_to_give_one(start_server, chat_models_root):
    server = await start_server(chat_models_root)
    with pytest.raises(openai.BadRequestError) as err:
        await sdk(server).chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}])
    assert "has no chat template" in err.value.message and "--chat-template base=FILE" in err.value.message


@pytest.mark.parametrize(
    ("model", "body", "says"),
    [
        ("qwen2.5", {"messages": []}, "messages is empty"),
        ("qwen2.5", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ("qwen2.5", {"messages": [{"role": "tool", "content": "1"}]}, "tool_call_id"),
        ("qwen2.5", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "content[0]"),
        ("mistral", {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "alternate"),
        ("qwen2.5", {"messages": [{"role": "user", "content": "x" * 200_000}]}, "tokens"),
        (
            "qwen2.5",
            {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3},
            "chat_template_kwargs",
        ),
        ("qwen2.5", {"messages": [{"role": "user", "content": "x"}], "presence_penalty": 3}, "presence_penalty"),
        ("qwen2.5", {"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True}, "stream"),
    ],
)
async def test_bad_chats_are_400_naming_the_field(model, body, says, chat_server):
    async with httpx.AsyncClient(base_url=chat_server.http_url) as http:
        reply = await http.post("/v1/chat/completions", json={"model": model, **body})
    assert reply.status_code == 400, reply.text
    assert says in reply.json()["error"]["message"]


async def test_reasoning_goes_to_reasoning_content(start_server, chat_models_root, tmp_path):
    """A DeepSeek-R1-style template opens <think> in its generation prompt: the reply up to
    </think> is reasoning_content (here all of it: random weights never close the tag), in the
    message and in the stream's deltas; the same prompt's completion is that very text."""
    r1 = template("qwen3").replace(
        "{{- '<|im_start|>assistant\\n' }}\n", "{{- '<|im_start|>assistant\\n<think>\\n' }}\n"
    )
    assert r1 != template("qwen3")
    file = tmp_path / "r1.jinja"
    file.write_text(r1, encoding="utf-8")
    server = await start_server(chat_models_root, chat_template=f"qwen3={file}")
    client = sdk(server)
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    reply = await client.chat.completions.create(model="qwen3", messages=messages, max_tokens=NEW_TOKENS)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        ids = (await http.post("/tokenize", json={"model": "qwen3", "messages": messages})).json()["tokens"]
    plain = await client.completions.create(model="qwen3", prompt=ids, max_tokens=NEW_TOKENS)
    text = plain.choices[0].text
    thought, said = [*text.split("</think>", 1), ""][:2]
    message = reply.choices[0].message
    assert message.reasoning_content == thought and message.content == said.lstrip("\n")
    stream = await client.chat.completions.create(model="qwen3", messages=messages, max_tokens=NEW_TOKENS, stream=True)
    deltas = [e.choices[0].delta async for e in stream]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == said.lstrip("\n")


async def test_an_unreadable_or_broken_override_stops_the_start(start_server, chat_models_root, tmp_path):
    with pytest.raises(ModelDirError, match=r"missing\.jinja: unreadable"):
        await start_server(chat_models_root, chat_template=f"qwen2.5={tmp_path / 'missing.jinja'}")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }}", encoding="utf-8")
    with pytest.raises(ModelDirError, match=r"broken\.jinja: the chat template does not parse"):
        await start_server(chat_models_root, chat_template=f"qwen2.5={broken}")
    with pytest.raises(ModelLoadError, match="chat_template names qwen9, not a generation model served here"):
        await start_server(chat_models_root, chat_template=f"qwen9={broken}")
