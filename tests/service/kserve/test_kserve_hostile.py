"""Hostile KServe requests (issue 33) against a real server on 127.0.0.1: shapes of many huge
dimensions, millions of raw BYTES elements and undecodable values are refused with 400 /
INVALID_ARGUMENT naming the field, before any per-element work, and nothing is logged as an error;
a gzip body of several members is inflated whole.
bench/hostile_input.py runs the same probes against a server process and prints their figures."""

from __future__ import annotations

import gzip
import json
import zlib

import grpc
import httpx2 as httpx  # the HTTP client the openai SDK itself depends on
import pytest

from service.kserve.arrays import LENGTH
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc

TEXT = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}
SHAPES = [  # shape -> what the refusal says
    ([2**62] * 120000, "at most 64 dimensions"),  # a 2.5 MB body
    ([0] * 65, "at most 64 dimensions"),
    ([2**62] * 3, "holds more than 16777216 elements"),
    ([0, 2**64], "holds more than 16777216 elements"),
    ([0, 2**40, 2**40], "holds more than 16777216 elements"),
    ([-1], "must be an array of non-negative integers"),
]


def no_errors_logged(caplog) -> None:
    bad = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


async def rest_infer(server, body: bytes | dict, headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        if isinstance(body, dict):
            return await http.post("/v2/models/tiny-embed/infer", json=body, headers=headers)
        return await http.post("/v2/models/tiny-embed/infer", content=body, headers=headers)


async def grpc_infer(server, request: oip.ModelInferRequest) -> grpc.aio.AioRpcError:
    request.model_name = "tiny-embed"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await oip_grpc.GRPCInferenceServiceStub(server.channel).ModelInfer(request)
    return caught.value


async def test_shapes_are_bounded_before_they_are_multiplied(server, caplog):
    for shape, message in SHAPES:
        reply = await rest_infer(server, {"inputs": [{**TEXT, "shape": shape}]})
        assert reply.status_code == 400 and message in reply.json()["error"], (shape[:4], reply.text)
        assert "inputs[0] ('text').shape" in reply.json()["error"]
        if min(shape) >= 0 and max(shape) < 2**63:  # what int64 carries
            request = oip.ModelInferRequest()
            request.inputs.add(name="text", datatype="BYTES", shape=shape[:60000]).contents.bytes_contents.append(b"a")
            refused = await grpc_infer(server, request)
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and message in refused.details(), shape[:4]
    no_errors_logged(caplog)


async def test_millions_of_raw_bytes_elements_are_counted_before_they_are_split(server, caplog):
    many = LENGTH.pack(0) * 4_000_000  # 16 MB of empty elements
    for shape, raw, message in (
        ([4_000_000], many, "4000000 inputs in one call; the limit is 256 (embed_max_inputs)"),
        ([200], many, "raw BYTES content holds more than the shape's 200 elements"),
        ([200], many[:40], "holds 200 elements but its binary data 10 at most"),
    ):
        request = oip.ModelInferRequest(raw_input_contents=[raw])
        request.inputs.add(name="text", datatype="BYTES", shape=shape)
        refused = await grpc_infer(server, request)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and message in refused.details(), shape
    no_errors_logged(caplog)


async def test_undecodable_values_are_400_naming_the_field(server, caplog):
    surrogate = b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "\\ud800"]}]}'
    reply = await rest_infer(server, surrogate)
    assert reply.status_code == 400 and "inputs[0] ('text').data[1] is not valid Unicode" in reply.json()["error"]
    request_id = b'{"id": "\\udfff", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}'
    reply = await rest_infer(server, request_id)
    assert reply.status_code == 400 and "id is not valid Unicode" in reply.json()["error"]
    for digits in (b"\xb2", "٣".encode()):  # a superscript two; an Arabic-Indic three (int() reads it)
        reply = await rest_infer(server, {"inputs": [TEXT]}, {"inference-header-content-length": digits})
        assert reply.status_code == 400 and "Inference-Header-Content-Length" in reply.json()["error"]
    huge = b'{"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1' + b"0" * 400 + b"]}]}"
    reply = await rest_infer(server, huge)
    assert reply.status_code == 400, reply.text
    ok = await rest_infer(server, {"id": "réq-1", "inputs": [TEXT]})
    assert ok.status_code == 200 and ok.json()["id"] == "réq-1"
    no_errors_logged(caplog)


async def test_gzip_members_are_all_inflated_and_bytes_after_them_refused(server, caplog):
    body = json.dumps({"inputs": [{**TEXT, "shape": [2], "data": ["a b", "c"]}]}).encode()
    one = await rest_infer(server, gzip.compress(body), {"content-encoding": "gzip"})
    two = await rest_infer(server, gzip.compress(body[:25]) + gzip.compress(body[25:]), {"content-encoding": "gzip"})
    assert one.status_code == two.status_code == 200, two.text
    assert two.json()["outputs"] == one.json()["outputs"]
    for encoding, data, message in (
        ("gzip", gzip.compress(body) + b"trailing", "the 8 bytes after its member 1 is not valid gzip data"),
        ("deflate", zlib.compress(body) + b"x", "1 bytes follow the deflate stream"),
        ("gzip", gzip.compress(body) + gzip.compress(body)[:30], "the gzip body is cut short"),
    ):
        reply = await rest_infer(server, data, {"content-encoding": encoding})
        assert reply.status_code == 400 and message in reply.json()["error"], (encoding, reply.text)
    no_errors_logged(caplog)
