"""`--frontends 2` (with one engine core, and with `--engines 2`) answers every door as one process
does: each gRPC RPC (KServe's ModelInfer too) and each HTTP route, over fresh connections (so both
front ends answer), gives the same result as `python -m service` over the same models: embeddings,
greedy tokens, logprobs, structured output, chats, translations, fill-mask, rerank, classify,
attention, sparse vectors; and the same refusals."""

from __future__ import annotations

import json
import re

import grpc
import httpx2 as httpx
import pytest
from google.protobuf.message import Message

from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from tests.fixtures.process import ServiceProcess
from tests.service.split.conftest import SplitGroup, own_channel, stop

CONNECTIONS = 4  # calls of each request to the group, each on its own connection
USER = pb.ChatMessage(role="user", content="hello there")
REGEX = json.dumps({"regex": "[0-9]{3}"})


def kserve_embed() -> oip.ModelInferRequest:
    request = oip.ModelInferRequest(model_name="tiny-embed")
    request.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"a b", b"c"])
    return request


UNARY = [  # (stub, method, request)
    (pb_grpc.EmbeddingServiceStub, "Embed", pb.EmbedRequest(inputs=["hello world", "a second text"])),
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="Once upon", max_new_tokens=12)),
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="Once", max_new_tokens=6, logprobs=2)),
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="x", structured_outputs_json=REGEX)),
    (pb_grpc.GenerationServiceStub, "Chat", pb.ChatRequest(messages=[USER], max_new_tokens=8)),
    (pb_grpc.TranslationServiceStub, "Translate", pb.TranslateRequest(inputs=["abc", "de"], max_length=6)),
    (pb_grpc.FillMaskServiceStub, "FillMask", pb.FillMaskRequest(inputs=["a [MASK] b"], top_k=3)),
    (pb_grpc.ClassificationServiceStub, "Rerank", pb.RerankRequest(query="q", documents=["one", "two", "three"])),
    (pb_grpc.ClassificationServiceStub, "Classify", pb.ClassifyRequest(inputs=[pb.ClassifyInput(text="some")])),
    (pb_grpc.InspectionServiceStub, "Attention", pb.AttentionRequest(text="look here")),
    (pb_grpc.SparseEmbeddingServiceStub, "EmbedSparse", pb.EmbedSparseRequest(inputs=["sparse words", "more"])),
    (pb_grpc.ModelServiceStub, "ListModels", pb.ListModelsRequest()),
    (pb_grpc.ModelServiceStub, "GetModel", pb.GetModelRequest(name="tiny-gpt")),
    (oip_grpc.GRPCInferenceServiceStub, "ModelInfer", kserve_embed()),
    # refusals: the same status and message
    (pb_grpc.EmbeddingServiceStub, "Embed", pb.EmbedRequest(inputs=[])),
    (pb_grpc.EmbeddingServiceStub, "Embed", pb.EmbedRequest(inputs=["a"], dimensions=100000)),
    (pb_grpc.EmbeddingServiceStub, "Embed", pb.EmbedRequest(inputs=["a", "b " * 3000], truncate=False)),
    (pb_grpc.EmbeddingServiceStub, "Embed", pb.EmbedRequest(inputs=["a"], prompt_name="nope")),
    (pb_grpc.EmbeddingServiceStub, "Embed", pb.EmbedRequest(inputs=["a"], model="tiny-gpt")),
    (pb_grpc.EmbeddingServiceStub, "Embed", pb.EmbedRequest(inputs=["a b c"], dimensions=4, normalize=False)),
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="x", model="nope")),
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="x", temperature=-1)),
    # prompts a front end leaves to the engine's tokenizer: empty, over the token limit, over the characters'
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="", max_new_tokens=3)),
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="Once upon a time " * 15)),
    (pb_grpc.GenerationServiceStub, "Generate", pb.GenerateRequest(prompt="b " * 5000)),
    (pb_grpc.TranslationServiceStub, "Translate", pb.TranslateRequest(inputs=[""])),
    (pb_grpc.SparseEmbeddingServiceStub, "EmbedSparse", pb.EmbedSparseRequest(inputs=["a"], model="tiny-embed")),
]
HTTP = [  # (path, body)
    ("/v1/embeddings", {"input": ["hello world", "again"]}),
    ("/v1/completions", {"prompt": "Once upon", "max_tokens": 8, "logprobs": 2, "echo": True}),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 4, "n": 2}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5, "structured_outputs": {"regex": "[a-c]{4}"}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}),
    ("/v1/translate", {"inputs": ["abc"], "max_length": 5}),
    ("/v1/fill-mask", {"inputs": ["a [MASK] b"], "top_k": 2}),
    ("/rerank", {"query": "q", "texts": ["one", "two"]}),
    ("/predict", {"inputs": "some text"}),
    ("/embed_sparse", {"inputs": ["sparse words", "more"]}),
    ("/tokenize", {"prompt": "Once upon"}),
    ("/v2/models/tiny-embed/infer", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 9000}),  # refused alike
    ("/v1/completions", {"prompt": ["a", "Once upon a time " * 15], "max_tokens": 4}),  # the second too long
    ("/v1/completions", {"prompt": [[5, 6, 7], "Once upon"], "max_tokens": 4}),  # ids beside a text
]
# differ from one call to the next (cached_tokens: the prefix cache's state, which repeated calls change)
VOLATILE = {"id", "created", "timings", "system_fingerprint", "cached_tokens"}
MEASURED = "serving.execution_chosen_by"


@pytest.fixture(scope="module", params=[1, 2], ids=["one-engine", "two-engines"])
def pair(request, all_kinds_root, chat_template_file):
    flags = ("--chat-template", f"tiny-gpt={chat_template_file}")
    one = ServiceProcess(all_kinds_root, *flags)
    try:
        group = SplitGroup(all_kinds_root, 2, *flags, engines=request.param)
    except BaseException:
        stop(one)
        raise
    yield one, group
    stop(group)
    stop(one)


def scrub(message: Message) -> Message:
    """The message without what differs from one call to the next (timings, cached prompt tokens)
    or from one process to the next (the figures a load measures: why a layout serves, what a pass costs)."""
    for field, value in message.ListFields():
        if field.name in VOLATILE:
            message.ClearField(field.name)
        elif field.name == "manifest" and MEASURED in value:
            value[MEASURED] = re.sub(r"\d+(\.\d+)?", "N", value[MEASURED])
        elif field.message_type is not None and field.is_repeated:
            for item in value if not field.message_type.GetOptions().map_entry else []:
                scrub(item)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            scrub(value)
    return message


def answer(address: str, stub, method: str, request) -> tuple:
    with own_channel(address) as channel:
        try:
            return ("ok", scrub(getattr(stub(channel), method)(request, timeout=60)))
        except grpc.RpcError as e:
            return (e.code(), e.details())


def stream(address: str, request: pb.GenerateRequest) -> tuple:
    with own_channel(address) as channel:
        chunks = list(pb_grpc.GenerationServiceStub(channel).GenerateStream(request, timeout=60))
    return "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids], chunks[-1].finish_reason


def test_every_grpc_call_answers_as_one_process(pair):
    one, group = pair
    for stub, method, request in UNARY:
        expected = answer(one.address, stub, method, request)
        for _ in range(CONNECTIONS):
            assert answer(group.address, stub, method, request) == expected, (method, request)


def test_streams_and_embed_streams_answer_as_one_process(pair):
    one, group = pair
    request = pb.GenerateRequest(prompt="Once upon a time", max_new_tokens=40)
    expected = stream(one.address, request)
    assert expected[1]
    for _ in range(CONNECTIONS):
        assert stream(group.address, request) == expected
    requests = [pb.EmbedRequest(inputs=[f"text {i}"], request_id=str(i)) for i in range(3)]
    answers = []
    for address in (one.address, group.address):
        with own_channel(address) as channel:
            answers.append([scrub(r) for r in pb_grpc.EmbeddingServiceStub(channel).EmbedStream(iter(requests))])
    assert answers[0] == answers[1] and len(answers[0]) == 3


def plain(value):
    """A JSON answer without the fields that differ from one call to the next."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def test_every_http_route_answers_as_one_process(pair):
    one, group = pair
    for path, body in HTTP:
        reply = httpx.post(one.http_url + path, json=body, timeout=60)
        expected = (reply.status_code, plain(reply.json()))
        for _ in range(CONNECTIONS):
            theirs = httpx.post(group.http_url + path, json=body, timeout=60)  # a new connection each
            assert (theirs.status_code, plain(theirs.json())) == expected, path


def test_http_stream_answers_as_one_process(pair):
    one, group = pair
    body = {"prompt": "Once upon a time", "max_tokens": 30, "stream": True}

    def text(url: str) -> str:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as reply:
            events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
        return "".join(e["choices"][0]["text"] for e in events if e["choices"])

    expected = text(one.http_url)
    assert expected
    assert all(text(group.http_url) == expected for _ in range(CONNECTIONS))


def test_both_front_ends_answered_and_each_engine_reports_its_cpu(pair):
    _, group = pair
    metrics = group.metrics()
    per_frontend = [metrics.get(("ts_worker_rpcs_total", (("worker", str(i)),)), 0.0) for i in group.frontends]
    assert min(per_frontend) > 0, per_frontend
    cpu, busy = (per_engine(metrics, name) for name in ("ts_engine_cpu_seconds_total", "ts_engine_busy_ratio"))
    assert sorted(cpu) == sorted(busy) == [str(i) for i in group.engines], (cpu, busy)
    assert all(v > 0 for v in cpu.values()), cpu
    assert all(0 <= v <= 1 for v in busy.values()), busy


def per_engine(metrics: dict, name: str) -> dict[str, float]:
    return {dict(labels)["engine"]: v for (series, labels), v in metrics.items() if series == name}
