"""A full queue and a passed deadline at both doors, for Generate, Translate and FillMask.

A full queue answers RESOURCE_EXHAUSTED (HTTP 429) at once; a deadline that passes while a call
waits answers DEADLINE_EXCEEDED (HTTP 504) and its queued work is dropped, never computed
(docs/api.md). Embed's are in test_service_batching.py. Real servers over the tiny models, with one
compute worker and one row decoded or encoded at a time (settings), so calls wait behind real work:
64-token generations, many sources to translate, many inputs to fill. Outcomes are read from what
the client got and from the server's own metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import httpx2 as httpx
import pytest
from google.protobuf import json_format

from service.proto import inference_pb2 as pb
from tests.fixtures.server import RunningServer, metric, until

GPT, TRANSLATOR, FILLER = "tiny-gpt", "tiny-translate", "tiny-fill-mask"
SERVICES = {"Generate": "GenerationService", "Translate": "TranslationService", "FillMask": "FillMaskService"}
ROUTES = {"Generate": "/v1/completions", "Translate": "/v1/translate", "FillMask": "/v1/fill-mask"}
MASKED = "the little [MASK] sat on the mat with a red ball"


@dataclasses.dataclass
class Outcome:
    code: str  # the gRPC status name (HTTP: the error body's code; 200 is OK)
    message: str = ""
    input_tokens: int = 0
    output_tokens: int = 0


def generate(max_new_tokens: int = 64) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt="Once upon a time", model=GPT, max_new_tokens=max_new_tokens)


def translate(n: int) -> pb.TranslateRequest:
    return pb.TranslateRequest(
        inputs=[f"How are you today, my friend number {i}?" for i in range(n)], model=TRANSLATOR, beam_size=1
    )


def fill_mask(n: int) -> pb.FillMaskRequest:
    return pb.FillMaskRequest(inputs=[MASKED] * n, model=FILLER)


async def over_grpc(srv: RunningServer, method: str, request, timeout: float | None = None) -> Outcome:
    stub = {"Generate": srv.generation, "Translate": srv.translation, "FillMask": srv.fill_mask}[method]
    try:
        reply = await getattr(stub, method)(request, timeout=timeout)
    except grpc.aio.AioRpcError as e:
        return Outcome(e.code().name, e.details() or "")
    return Outcome("OK", "", reply.usage.input_tokens, reply.usage.output_tokens)


def http_body(method: str, request) -> dict:
    if method == "Generate":
        return {"model": request.model, "prompt": request.prompt, "max_tokens": request.max_new_tokens}
    return json_format.MessageToDict(request, preserving_proto_field_name=True)


async def over_http(http: httpx.AsyncClient, method: str, request, timeout: float | None = None) -> Outcome:
    headers = {} if timeout is None else {"X-Request-Timeout": str(timeout)}
    reply = await http.post(ROUTES[method], json=http_body(method, request), headers=headers)
    body = reply.json()
    if reply.status_code != 200:
        return Outcome(body["error"]["code"], body["error"]["message"])
    usage = body["usage"]
    if method == "Generate":
        return Outcome("OK", "", usage["prompt_tokens"], usage["completion_tokens"])
    return Outcome("OK", "", int(usage["input_tokens"]), int(usage["output_tokens"]))


@pytest.fixture(params=["grpc", "http"])
async def door(request):
    """call(srv, method, request, timeout=None) -> Outcome through one door; its protocol label."""
    if request.param == "grpc":
        yield over_grpc, "grpc"
        return
    clients: list[httpx.AsyncClient] = []

    async def call(srv: RunningServer, method: str, message, timeout: float | None = None) -> Outcome:
        if not clients:
            clients.append(
                httpx.AsyncClient(base_url=srv.http_url, timeout=60, limits=httpx.Limits(max_connections=100))
            )
        return await over_http(clients[0], method, message, timeout)

    yield call, "http"
    for c in clients:
        await c.aclose()


def requests(method: str, model: str, code: str, protocol: str) -> float:
    """The server's count of `method` calls that ended with `code` (HTTP streams count as the RPC)."""
    return metric(
        "ts_requests_total",
        {"service": SERVICES[method], "method": method, "model": model, "code": code, "protocol": protocol},
    )


def tokens(model: str, direction: str) -> float:
    return metric("ts_tokens_total", {"model": model, "direction": direction})


def dropped(model: str, reason: str) -> float:
    return metric("ts_dropped_items_total", {"model": model, "reason": reason})


# --- a full queue ------------------------------------------------------------------------------


async def test_generate_full_queue_is_resource_exhausted(start_server, door):
    """Room for two waiting calls (one row decodes): a burst of 40 calls finds the queue full."""
    call, protocol = door
    srv = await start_server(compute_workers=1, gen_max_batch=1, gen_max_queue=2)
    refused_before = requests("Generate", GPT, "RESOURCE_EXHAUSTED", protocol)
    outcomes = await asyncio.gather(*[call(srv, "Generate", generate()) for _ in range(40)])
    served = [o for o in outcomes if o.code == "OK"]
    refused = [o for o in outcomes if o.code != "OK"]
    assert {o.code for o in refused} == {"RESOURCE_EXHAUSTED"}, refused
    assert len(served) >= 2 and all(o.output_tokens == 64 for o in served)  # the queue's (+ the row's)
    assert refused and all(GPT in o.message and "queue" in o.message for o in refused)
    assert requests("Generate", GPT, "RESOURCE_EXHAUSTED", protocol) == refused_before + len(refused)
    assert (await call(srv, "Generate", generate())).output_tokens == 64  # the queue drained: served again


async def test_translate_full_queue_is_resource_exhausted(start_server, door):
    """Room for 32 queued sources: of two 32-source calls sent together, the second finds it full."""
    call, protocol = door
    srv = await start_server(compute_workers=1, translate_max_batch=1, translate_max_queue=32, translate_max_inputs=32)
    refused_before = requests("Translate", TRANSLATOR, "RESOURCE_EXHAUSTED", protocol)
    outcomes = await asyncio.gather(call(srv, "Translate", translate(32)), call(srv, "Translate", translate(32)))
    assert sorted(o.code for o in outcomes) == ["OK", "RESOURCE_EXHAUSTED"], outcomes
    refused = next(o for o in outcomes if o.code != "OK")
    assert TRANSLATOR in refused.message and "queue" in refused.message
    assert requests("Translate", TRANSLATOR, "RESOURCE_EXHAUSTED", protocol) == refused_before + 1
    assert (await call(srv, "Translate", translate(32))).code == "OK"  # the queue drained: served again


async def test_fill_mask_full_queue_is_resource_exhausted(start_server, fill_models_root, door):
    """Room for 256 queued inputs, one input per forward pass: of two 256-input calls sent together,
    the second finds the queue full while the first is still computed."""
    call, protocol = door
    srv = await start_server(
        fill_models_root, compute_workers=1, embed_max_batch_size=1, embed_max_wait_ms=0.0, embed_max_queue=256
    )
    refused_before = requests("FillMask", FILLER, "RESOURCE_EXHAUSTED", protocol)
    outcomes = await asyncio.gather(call(srv, "FillMask", fill_mask(256)), call(srv, "FillMask", fill_mask(256)))
    assert sorted(o.code for o in outcomes) == ["OK", "RESOURCE_EXHAUSTED"], outcomes
    refused = next(o for o in outcomes if o.code != "OK")
    assert FILLER in refused.message and "of 256 queued inputs" in refused.message
    assert requests("FillMask", FILLER, "RESOURCE_EXHAUSTED", protocol) == refused_before + 1
    assert (await call(srv, "FillMask", fill_mask(256))).code == "OK"  # the queue drained: served again


# --- a deadline that passes in the queue -------------------------------------------------------


async def expires_behind(
    srv: RunningServer, call, method: str, model: str, protocol: str, ahead: list, late, queued: int
) -> list[Outcome]:
    """Sends the `ahead` calls, waits until `queued` items wait in the model's queue, then sends `late`
    with a 0.1 s deadline; checks it expired and was dropped; returns the outcomes of those ahead."""
    expired_before = requests(method, model, "DEADLINE_EXCEEDED", protocol)
    dropped_before = dropped(model, "expired")
    first = [asyncio.ensure_future(call(srv, method, request)) for request in ahead]
    await until(lambda: metric("ts_queue_depth", {"model": model}) >= queued, what=f"{queued} queued items")
    late_outcome = await call(srv, method, late, timeout=0.1)
    assert late_outcome.code == "DEADLINE_EXCEEDED", late_outcome
    await until(
        lambda: requests(method, model, "DEADLINE_EXCEEDED", protocol) == expired_before + 1,
        what="the server counting the expired call",
    )
    outcomes = await asyncio.gather(*first)
    assert {o.code for o in outcomes} == {"OK"}, outcomes
    assert dropped(model, "expired") > dropped_before  # dropped as expired, not computed
    return outcomes


async def test_generate_deadline_in_the_queue(start_server, door):
    call, protocol = door
    srv = await start_server(compute_workers=1, gen_max_batch=1)
    generated = tokens(GPT, "output")
    ahead = await expires_behind(srv, call, "Generate", GPT, protocol, [generate()] * 48, generate(), queued=40)
    assert tokens(GPT, "output") - generated == sum(o.output_tokens for o in ahead)  # none for the late call


async def test_translate_deadline_in_the_queue(start_server, door):
    call, protocol = door
    srv = await start_server(compute_workers=1, translate_max_batch=1)
    translated = tokens(TRANSLATOR, "output")
    ahead = await expires_behind(srv, call, "Translate", TRANSLATOR, protocol, [translate(48)], translate(1), queued=40)
    assert tokens(TRANSLATOR, "output") - translated == sum(o.output_tokens for o in ahead)


async def test_fill_mask_deadline_in_the_queue(start_server, fill_models_root, door):
    call, protocol = door
    srv = await start_server(fill_models_root, compute_workers=1, embed_max_batch_size=1, embed_max_wait_ms=0.0)
    read = tokens(FILLER, "input")
    ahead = await expires_behind(
        srv, call, "FillMask", FILLER, protocol, [fill_mask(256)] * 4, fill_mask(1), queued=600
    )
    assert tokens(FILLER, "input") - read == sum(o.input_tokens for o in ahead)  # the late input never ran
