"""Property test of the whole contract: random requests for every RPC against a real server.

The requests come from bench/fuzzgen.py, which walks the proto descriptors (every service,
method and field; new ones are fuzzed automatically). Each call must end with a documented
status (never INTERNAL or UNKNOWN), within its deadline (no hang), with a bounded message; after
the run the server is still healthy and answers a normal call. Seeded, so CI draws the same
examples every time; bench/fuzz.py runs the same generator for 10,000+ requests.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, example, given, seed, settings

from bench.fuzzgen import Client, calls, rpcs
from service.errors import MESSAGE_BYTES
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}  # nothing cancels or drains during the run
CALL_TIMEOUT_S = 60.0  # generous for a loaded CI machine: reaching it means the call hung
EXAMPLES = 300
SEED = 15
# One request per RPC that must get through, tried before the drawn ones: the test asks every RPC to
# answer OK at least once, and an RPC whose every field has a limit (InspectionService/Attention:
# text length, target, layers, heads) rarely gets a random request through. A new RPC needs one.
VALID = {
    "EmbeddingService/Embed": pb.EmbedRequest(inputs=["fuzz"]),
    "EmbeddingService/EmbedStream": [pb.EmbedRequest(inputs=["fuzz"])],
    "GenerationService/Generate": pb.GenerateRequest(prompt="fuzz", max_new_tokens=2),
    "GenerationService/GenerateStream": pb.GenerateRequest(prompt="fuzz", max_new_tokens=2),
    "TranslationService/Translate": pb.TranslateRequest(inputs=["fuzz"], max_length=2),
    "ModelService/ListModels": pb.ListModelsRequest(),
    "ModelService/GetModel": pb.GetModelRequest(name="tiny-embed"),
    "InspectionService/Attention": pb.AttentionRequest(text="fuzz"),
    "FillMaskService/FillMask": pb.FillMaskRequest(inputs=["fuzz [MASK]"]),
    "ClassificationService/Rerank": pb.RerankRequest(query="fuzz", documents=["fuzz"]),
    "ClassificationService/Classify": pb.ClassifyRequest(inputs=[pb.ClassifyInput(text="fuzz")]),
    "SparseEmbeddingService/EmbedSparse": pb.EmbedSparseRequest(inputs=["fuzz"]),
    "GenerationService/Chat": pb.ChatRequest(messages=[pb.ChatMessage(role="user", content="fuzz")], max_new_tokens=2),
    "GenerationService/ChatStream": pb.ChatRequest(
        messages=[pb.ChatMessage(role="user", content="fuzz")], max_new_tokens=2
    ),
}
# tiny-gpt chats with this template here (--chat-template): short, as its context is (48 prompt tokens)
CHAT_TEMPLATE = "{% for m in messages %}{{ m.role[0] }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}a:"
CHAT_TEMPLATE += "{% endif %}"
EXPLICIT = [(r, VALID[r.name]) for r in rpcs() if r.name in VALID]


def test_every_rpc_has_a_request_that_must_get_through():
    assert {r.name for r in rpcs()} <= set(VALID)


def test_every_rpc_of_the_proto_is_fuzzed():
    names = {r.name for r in rpcs()}
    assert {
        "EmbeddingService/Embed",
        "EmbeddingService/EmbedStream",
        "GenerationService/Generate",
        "GenerationService/GenerateStream",
        "TranslationService/Translate",
        "ModelService/GetModel",
        "ModelService/ListModels",
        "FillMaskService/FillMask",
        "ClassificationService/Rerank",
        "ClassificationService/Classify",
    } <= names


async def served_names(channel: grpc.aio.Channel) -> list[str]:
    listed = await pb_grpc.ModelServiceStub(channel).ListModels(pb.ListModelsRequest())
    return [m.name for m in listed.models]


def run_property(names: list[str], client: Client, loop: asyncio.AbstractEventLoop, seen: Counter) -> None:
    """The hypothesis run; in a worker thread, each call sent on the server's event loop."""

    @seed(SEED)  # the same examples on every run, whatever is edited in this function
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each step would be a server call
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(call=calls(names))
    @_explicit_examples
    def ends_with_a_documented_status(call) -> None:
        rpc, payload = call
        code, details = asyncio.run_coroutine_threadsafe(client.invoke(rpc, payload, CALL_TIMEOUT_S), loop).result()
        seen[rpc.name, code.name] += 1
        assert code in DOCUMENTED, f"{rpc.name}: {code.name}: {details}"
        assert len(details.encode()) <= MESSAGE_BYTES, details[:200]
        assert "metadata size" not in details, details  # a status message too big for the trailer

    ends_with_a_documented_status()


def _explicit_examples(test):
    for call in EXPLICIT:
        test = example(call=call)(test)
    return test


async def test_fuzzed_requests_end_with_documented_statuses(all_kinds_root, start_server, tmp_path):
    (tmp_path / "chat.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    # a model of every kind: every RPC can get through; tiny-gpt chats with the template above
    server = await start_server(all_kinds_root, chat_template=f"tiny-gpt={tmp_path / 'chat.jinja'}")
    client, seen = Client(server.address), Counter()
    try:
        await asyncio.to_thread(
            run_property, await served_names(server.channel), client, asyncio.get_running_loop(), seen
        )
    finally:
        await client.close()
    assert {rpc for rpc, code in seen if code == "OK"} == {r.name for r in rpcs()}, seen  # each got through
    health = await health_pb2_grpc.HealthStub(server.channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    response = await server.embedding.Embed(pb.EmbedRequest(inputs=["still here"]))
    assert len(response.embeddings) == 1
