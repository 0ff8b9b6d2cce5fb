"""The HTTP door against the real `openai` SDK and httpx, on a real server (127.0.0.1, ports 0).

The same server answers gRPC and HTTP; each HTTP result is compared with what gRPC returns for
the same request on the same models.
"""

from __future__ import annotations

import asyncio
import base64
import socket

import httpx2 as httpx  # the HTTP client the openai SDK itself depends on
import numpy as np
import openai
import pytest

from client import array, embed_request, generate_request
from service.proto import inference_pb2 as pb
from service.settings import Settings
from tests.fixtures.server import metric, until
from tests.service.embedding.test_service_batching import MODEL, BlockedExecutor, queued_behind_block

TEXTS = ["the quick brown fox", "hello", "a somewhat longer sentence with more words in it"]


def sdk(server) -> openai.AsyncOpenAI:
    # max_retries=0: the SDK retries 429 and 5xx by itself, which would hide the status under test.
    return openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


async def test_embeddings_float_and_base64_equal_grpc_embed(server):
    grpc_reply = await server.embedding.Embed(embed_request(TEXTS))
    expected = array(grpc_reply)
    client = sdk(server)
    floats = await client.embeddings.create(model="tiny-embed", input=TEXTS, encoding_format="float")
    assert np.array_equal(np.array([d.embedding for d in floats.data], dtype=np.float32), expected)
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.model == "tiny-embed"
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == grpc_reply.usage.input_tokens > 0
    b64 = await client.embeddings.create(model="tiny-embed", input=TEXTS, encoding_format="base64")
    raw = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in b64.data])
    assert np.array_equal(raw, expected)
    decoded = await client.embeddings.create(model="tiny-embed", input=TEXTS[1])  # the SDK asks base64, decodes
    alone = array(await server.embedding.Embed(embed_request([TEXTS[1]])))  # a batch of one, as here
    assert np.array_equal(np.array(decoded.data[0].embedding, dtype=np.float32), alone[0])


async def test_embeddings_dimensions(server):
    short = await sdk(server).embeddings.create(
        model="tiny-embed", input="hello", dimensions=4, encoding_format="float"
    )
    grpc_reply = await server.embedding.Embed(embed_request(["hello"], dimensions=4))
    assert np.array_equal(np.array(short.data[0].embedding, dtype=np.float32), array(grpc_reply)[0])


@pytest.mark.parametrize("params", [{}, {"temperature": 0.9, "top_p": 0.9, "seed": 5}], ids=["greedy", "seeded"])
async def test_completion_stream_equals_generate_stream(server, params):
    grpc_chunks = [
        c
        async for c in server.generation.GenerateStream(
            generate_request("Once upon a time", max_new_tokens=24, **params)
        )
    ]
    expected = "".join(c.text for c in grpc_chunks)
    stream = await sdk(server).completions.create(
        model="tiny-gpt", prompt="Once upon a time", max_tokens=24, stream=True, **params
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage.completion_tokens == grpc_chunks[-1].usage.output_tokens
    assert last.usage.prompt_tokens == grpc_chunks[-1].usage.input_tokens > 0


async def test_completion_unary_with_stop(server):
    full = await server.generation.Generate(generate_request("Once upon a time", max_new_tokens=30))
    stop = full.text[6:9]
    reply = await sdk(server).completions.create(model="tiny-gpt", prompt="Once upon a time", max_tokens=30, stop=stop)
    assert reply.choices[0].text == full.text[: full.text.find(stop)]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_models_lists_every_served_model(server):
    models = await sdk(server).models.list()
    assert sorted(m.id for m in models.data) == ["tiny-embed", "tiny-fill-mask", "tiny-gpt", "tiny-translate"]
    one = await sdk(server).models.retrieve("tiny-gpt")
    assert one.id == "tiny-gpt" and one.kind == "generation"


async def test_bad_model_is_404_in_openai_shape(server):
    with pytest.raises(openai.NotFoundError) as err:
        await sdk(server).embeddings.create(model="missing", input="hi")
    assert err.value.status_code == 404
    assert err.value.code == "NOT_FOUND" and "unknown model 'missing'" in err.value.message
    with pytest.raises(openai.NotFoundError):
        await sdk(server).completions.create(model="missing", prompt="hi", stream=True)
    with pytest.raises(openai.BadRequestError, match="is a embedding model, not a generation model"):
        await sdk(server).completions.create(model="tiny-embed", prompt="hi")


@pytest.fixture
async def srv(start_server, embed_models_root):
    return await start_server(
        embed_models_root, compute_workers=1, embed_max_wait_ms=0.0, embed_max_queue=4, embed_max_inputs=4
    )


async def test_full_queue_is_429_rate_limit(srv):
    async with queued_behind_block(srv, 4) as (first, waiting):
        with pytest.raises(openai.RateLimitError) as err:
            await sdk(srv).embeddings.create(model="tiny-embed", input="one more")
        assert err.value.status_code == 429 and err.value.code == "RESOURCE_EXHAUSTED"
    await first, await waiting


async def test_deadline_is_504(srv):
    async with BlockedExecutor(srv.server.runtime), httpx.AsyncClient(base_url=srv.http_url) as http:
        reply = await http.post("/v1/embeddings", json={"input": "late"}, headers={"X-Request-Timeout": "0.2"})
    assert reply.status_code == 504 and reply.json()["error"]["code"] == "DEADLINE_EXCEEDED"


async def test_stream_deadline_after_the_200_is_an_error_event(start_server):
    running = await start_server(compute_workers=1)
    async with BlockedExecutor(running.server.runtime):
        stream = await sdk(running).completions.create(
            model="tiny-gpt", prompt="Once", max_tokens=8, stream=True, extra_headers={"X-Request-Timeout": "0.3"}
        )
        with pytest.raises(openai.APIError, match="deadline") as err:
            [chunk async for chunk in stream]
    assert err.value.code == "DEADLINE_EXCEEDED"


async def test_translate_json_mirrors_translate_request(server):
    expected = await server.translation.Translate(pb.TranslateRequest(inputs=["hello world", "abc"], beam_size=2))
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post("/v1/translate", json={"inputs": ["hello world", "abc"], "beam_size": 2})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert [t["text"] for t in body["translations"]] == [t.text for t in expected.translations]
        assert body["model"] == "tiny-translate" and body["usage"]["input_tokens"] == expected.usage.input_tokens
        bad = await http.post("/v1/translate", json={"inputs": ["x"], "beam_size": "wide"})
        assert bad.status_code == 400 and "beam_size" in bad.json()["error"]["message"]
        too_wide = await http.post("/v1/translate", json={"inputs": ["x"], "beam_size": 1000})
        assert too_wide.status_code == 400 and too_wide.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/v1/embeddings", b"{not json", "not JSON"),
        ("/v1/embeddings", b"[1, 2]", "JSON object"),
        ("/v1/embeddings", b'{"input": [1, 2, 3]}', "array of strings"),
        ("/v1/embeddings", b'{"input": ""}', "inputs[0] is empty"),
        ("/v1/embeddings", b'{"input": "x", "encoding_format": "int8"}', "encoding_format"),
        ("/v1/embeddings", b'{"input": "x", "dimensions": -1}', "dimensions=-1"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": "many"}', "max_tokens must be an integer"),
        ("/v1/completions", b'{"prompt": "x", "temperature": true}', "temperature must be a number"),
        ("/v1/completions", b'{"prompt": "x", "n": 17}', "n must be in [1, 16]"),
        ("/v1/completions", b'{"prompt": ["a", 5]}', "prompt must be a string, an array of strings"),
    ],
)
async def test_bad_input_is_400_never_500(server, path, body, words):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post(path, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"
    assert error["code"] == "INVALID_ARGUMENT"


async def test_a_body_over_the_message_limit_is_400(start_server, embed_models_root):
    running = await start_server(embed_models_root, max_message_bytes=4096)
    async with httpx.AsyncClient(base_url=running.http_url) as http:
        reply = await http.post("/v1/embeddings", json={"input": "x" * 10_000})
    assert reply.status_code == 400 and "over 4096 bytes" in reply.json()["error"]["message"]


async def test_unknown_route_and_method_keep_the_error_shape(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        missing, wrong = await http.get("/v1/nothing"), await http.get("/v1/embeddings")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "UNIMPLEMENTED"


async def test_calls_are_counted_with_their_protocol(server):
    labels = {"service": "EmbeddingService", "method": "Embed", "model": "tiny-embed", "code": "OK"}
    http_before, grpc_before = (
        metric("ts_requests_total", {**labels, "protocol": "http"}),
        metric("ts_requests_total", {**labels, "protocol": "grpc"}),
    )
    await sdk(server).embeddings.create(model="tiny-embed", input="count me")
    await server.embedding.Embed(embed_request(["count me"]))
    assert metric("ts_requests_total", {**labels, "protocol": "http"}) == http_before + 1
    assert metric("ts_requests_total", {**labels, "protocol": "grpc"}) == grpc_before + 1
    stream = {
        "service": "GenerationService",
        "method": "GenerateStream",
        "model": "-",
        "code": "NOT_FOUND",
        "protocol": "http",
    }
    before = metric("ts_requests_total", stream)
    with pytest.raises(openai.NotFoundError):
        await sdk(server).completions.create(model="missing", prompt="hi", stream=True)
    assert metric("ts_requests_total", stream) == before + 1
    text = httpx.get(server.metrics_url).text
    assert 'protocol="http"' in text and 'protocol="grpc"' in text


async def test_health_and_drain(srv):
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        assert (await http.get("/health")).json() == {"status": "SERVING"}
        async with BlockedExecutor(srv.server.runtime):
            in_flight = asyncio.ensure_future(http.post("/v1/embeddings", json={"input": "finish me"}))
            await until(lambda: srv.server.http._inflight.count == 1)
            stopping = srv.server.shutdown(grace=10)
            await until(lambda: srv.server.registry.draining)
            health = await http.get("/health")
            refused = await http.post("/v1/embeddings", json={"input": "too late"})
        assert health.status_code == 503 and health.json() == {"status": "NOT_SERVING"}
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "UNAVAILABLE"
        finished = await in_flight
        assert finished.status_code == 200 and len(finished.json()["data"]) == 1
        await stopping
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.http_url + "/health")


def test_http_settings_flags_and_env():
    assert Settings.from_env(env={}).http_port == 8080
    assert Settings.from_env(env={"TS_HTTP_PORT": "0"}).http_port == 0
    assert Settings.from_args(["--http-port", "-1"], env={"TS_HTTP_PORT": "0"}).http_port == -1
    s = Settings.from_args(["--host", "0.0.0.0", "--http-host", "127.0.0.1"], env={})
    assert (s.http_address, s.metrics_address) == ("127.0.0.1", "0.0.0.0")
    with pytest.raises(ValueError, match="http_port must be >= -1"):
        Settings.from_env(env={}, http_port=-2)


async def test_http_off(start_server, embed_models_root):
    running = await start_server(embed_models_root, http_port=-1)
    assert running.server.http is None
    assert len((await running.embedding.Embed(embed_request(["still grpc"]))).embeddings) == 1


async def test_accepted_connections_have_tcp_nodelay(server):
    """Without TCP_NODELAY each small response waited ~40 ms on Nagle (the socket must say IPPROTO_TCP)."""
    async with httpx.AsyncClient(base_url=server.http_url) as http:  # keep-alive: the connection stays open
        assert (await http.get("/health")).status_code == 200
        connections = server.server.http._server.server_state.connections
        sockets = [c.transport.get_extra_info("socket") for c in connections]
        assert sockets and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


async def test_a_stream_whose_client_leaves_is_cancelled_and_freed(start_server):
    running = await start_server(compute_workers=1)
    labels = {
        "service": "GenerationService",
        "method": "GenerateStream",
        "model": "tiny-gpt",
        "code": "CANCELLED",
        "protocol": "http",
    }
    cancelled = metric("ts_requests_total", labels)
    body = {"prompt": "Once upon a time", "max_tokens": 60, "stream": True}
    # BlockedExecutor: no token can be computed meanwhile
    async with httpx.AsyncClient(base_url=running.http_url) as http, BlockedExecutor(running.server.runtime):
        async with http.stream("POST", "/v1/completions", json=body) as reply:
            assert reply.status_code == 200  # headers out: the generation is admitted and queued
        await until(lambda: metric("ts_requests_total", labels) == cancelled + 1)  # the client left
    await until(lambda: running.server.http._inflight.count == 0)
    await until(lambda: metric("ts_generations_in_flight", {"model": "tiny-gpt"}) == 0)  # its row freed


async def test_an_embed_whose_client_leaves_is_dropped_before_compute(srv):
    labels = {
        "service": "EmbeddingService",
        "method": "Embed",
        "model": "tiny-embed",
        "code": "CANCELLED",
        "protocol": "http",
    }
    cancelled, dropped = (
        metric("ts_requests_total", labels),
        metric("ts_dropped_items_total", {**MODEL, "reason": "cancelled"}),
    )
    queued, batches = metric("ts_queue_duration_seconds_count", MODEL), metric("ts_batch_size_count", MODEL)
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        async with BlockedExecutor(srv.server.runtime):
            client = asyncio.ensure_future(http.post("/v1/embeddings", json={"input": "never computed"}))
            await until(lambda: metric("ts_queue_duration_seconds_count", MODEL) == queued + 1)  # batch formed
            client.cancel()  # httpx closes the connection
            await until(lambda: metric("ts_requests_total", labels) == cancelled + 1)
        await until(lambda: metric("ts_dropped_items_total", {**MODEL, "reason": "cancelled"}) == dropped + 1)
        assert metric("ts_batch_size_count", MODEL) == batches
        assert (await http.post("/v1/embeddings", json={"input": "still serving"})).status_code == 200


async def test_a_taken_http_port_refuses_to_start(start_server, embed_models_root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot bind HTTP to 127.0.0.1:{port}"):
            await start_server(embed_models_root, http_port=port)
