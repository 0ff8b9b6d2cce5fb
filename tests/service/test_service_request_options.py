"""Per-request options in shared batches: a call's result does not depend on what shares its batch.

Each call below is made once alone (one at a time) and then again in a crowd of concurrent calls
with other settings (embeddings: dimensions, normalize, truncate; generation: greedy and sampled,
temperature, top_k, top_p, repetition_penalty, seed, stop sequences, max_new_tokens, unary and
stream). The crowd's results and statuses must equal the lone ones, and the batch-size metrics
must show the crowd really shared forward passes. The tiny models' weights are drawn wide
(export/tiny.py), so their logits are decisive: batching noise cannot flip a greedy choice.
"""

from __future__ import annotations

import asyncio
import itertools

import grpc
import numpy as np

from client import embed_request, generate_request
from service.proto import inference_pb2 as pb
from tests.fixtures.server import metric

TEXTS = ["hello", "a longer sentence with more words in it", "é ü ß", "x" * 120, "mid size text"]


async def outcome(call) -> tuple:
    """(status code name, result) of one call; the result of a failed call is its status only."""
    try:
        return "OK", await call
    except grpc.aio.AioRpcError as e:
        return e.code().name, None


def embed_calls() -> list[pb.EmbedRequest]:
    """Every combination of dimensions x normalize x truncate, each over a different slice of TEXTS."""
    combos = itertools.product([0, 8, 16], [None, True, False], [None, True, False])
    return [
        embed_request(TEXTS[i % 5 : i % 5 + 1 + i % 3], dimensions=d, normalize=n, truncate=t)
        for i, (d, n, t) in enumerate(combos)
    ]


def rows(response: pb.EmbedResponse | None) -> np.ndarray | None:
    return None if response is None else np.array([list(e.values) for e in response.embeddings])


def forward_passes(model: str) -> float:
    return metric("ts_batch_size_count", {"model": model})


async def test_embed_options_apply_to_their_own_rows(start_server, embed_models_root):
    srv = await start_server(embed_models_root, embed_max_wait_ms=20.0)
    requests = embed_calls()
    alone = [await outcome(srv.embedding.Embed(r)) for r in requests]
    passes, inputs = forward_passes("tiny-embed"), sum(len(r.inputs) for r in requests)
    crowd = await asyncio.gather(*(outcome(srv.embedding.Embed(r)) for r in requests))
    assert forward_passes("tiny-embed") - passes < inputs / 2  # the crowd shared forward passes
    for request, (code, response), (crowd_code, crowd_response) in zip(requests, alone, crowd, strict=True):
        assert crowd_code == code, request
        if code != "OK":
            too_long = "x" * 120 in request.inputs
            assert request.HasField("truncate") and not request.truncate and too_long  # the only failing kind
            continue
        got, want = rows(crowd_response), rows(response)
        assert want.shape == (len(request.inputs), request.dimensions or 32)
        norms = np.linalg.norm(want, axis=1)
        if not request.HasField("normalize") or request.normalize:
            assert np.allclose(norms, 1.0, atol=1e-5), norms
        else:  # the tiny model's raw vectors are far from unit length
            assert not np.isclose(norms, 1.0, atol=1e-3).any(), norms
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(request))


def generate_calls(stop: str) -> list[pb.GenerateRequest]:
    """Greedy and sampled calls with distinct settings, prompts and lengths."""
    greedy = [
        generate_request("Once upon a time", max_new_tokens=24),
        generate_request("Once upon a time", max_new_tokens=24, stop=[stop]),
        generate_request("The cat", max_new_tokens=5),
        generate_request("The cat", max_new_tokens=30, repetition_penalty=1.5),
        generate_request("é ü", max_new_tokens=12, repetition_penalty=0.7, stop=["zz", stop]),
    ]
    sampled = [
        generate_request(p, max_new_tokens=n, temperature=t, top_k=k, top_p=tp, repetition_penalty=rp, seed=s)
        for p, n, t, k, tp, rp, s in [
            ("Once", 20, 1.0, 0, 0.0, 0.0, 1),
            ("Once", 20, 1.0, 0, 0.0, 0.0, 2),
            ("A dog", 16, 0.7, 5, 0.0, 1.2, 3),
            ("A dog", 28, 1.5, 0, 0.8, 0.0, 3),
            ("Hi", 9, 2.0, 40, 0.95, 1.1, 4),
            ("Hi", 24, 0.3, 2, 0.5, 0.0, 5),
        ]
    ]
    return greedy + sampled


async def streamed(srv, request: pb.GenerateRequest) -> tuple:
    chunks = [c async for c in srv.generation.GenerateStream(request)]
    return "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids], chunks[-1].finish_reason


def unary(response: pb.GenerateResponse) -> tuple:
    return response.text, list(response.token_ids), response.finish_reason


async def test_generate_options_apply_to_their_own_rows(server):
    first = await server.generation.Generate(generate_request("Once upon a time", max_new_tokens=24))
    assert len(first.text) > 10
    requests = generate_calls(stop=first.text[6:9])
    alone = [unary(await server.generation.Generate(r)) for r in requests]
    stop = first.text[6:9]
    assert alone[1][2] == pb.FINISH_REASON_STOP_SEQUENCE and alone[1][0] == first.text[: first.text.find(stop)]
    single = metric("ts_generation_batch_size_bucket", {"model": "tiny-gpt", "le": "1.0"})
    steps = metric("ts_generation_batch_size_count", {"model": "tiny-gpt"})
    crowd = await asyncio.gather(
        *[call for r in requests for call in (server.generation.Generate(r), streamed(server, r))]
    )
    shared = (
        metric("ts_generation_batch_size_count", {"model": "tiny-gpt"})
        - steps
        - (metric("ts_generation_batch_size_bucket", {"model": "tiny-gpt", "le": "1.0"}) - single)
    )
    assert shared > 0  # some decode steps ran several of the crowd's rows together
    for request, want, got_unary, got_stream in zip(requests, alone, crowd[0::2], crowd[1::2], strict=True):
        assert unary(got_unary) == want, request
        assert got_stream == want, request
    sampled = alone[5:]
    assert sampled[0][1] != sampled[1][1]  # seeds 1 and 2 differ: the comparison above is not vacuous
