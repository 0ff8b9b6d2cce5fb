"""Error messages stay bounded: huge request values are quoted cut short and the status survives.

gRPC sends the status message in a trailer; a message over the client's metadata limit turns
the status into RESOURCE_EXHAUSTED ("received metadata size exceeds hard limit"). These calls
carry names and values of 20,000 to 100,000 characters (ASCII and 4-byte UTF-8) and must get
the status the server meant, with the value's length stated.
"""

from __future__ import annotations

import grpc
import pytest

from service.errors import MESSAGE_BYTES, bounded, quote
from service.proto import inference_pb2 as pb

HUGE = ["n" * 20_000, "\U0001f600" * 100_000]  # ASCII; 4-byte UTF-8 (12 bytes each once percent-encoded)


def test_quote_cuts_long_values_and_states_their_length():
    assert quote("abc") == "'abc'"
    quoted = quote("x" * 20_000, limit=8)
    assert quoted == "'xxxxxxxx…' (20000 characters)"
    assert quote("\n\x00", limit=8) == repr("\n\x00")  # control characters escaped, never raw


def test_bounded_caps_utf8_bytes_on_a_character_boundary():
    long = "é" * 5000
    cut = bounded(long)
    assert len(cut.encode()) <= MESSAGE_BYTES and cut.endswith("(message cut; 10000 bytes in full)")
    assert cut.startswith("éé")
    assert bounded("short") == "short"
    assert bounded("a\ud800b") == "a?b"  # a lone surrogate cannot be sent: replaced


async def expect(call, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    details = info.value.details()
    assert len(details.encode()) <= MESSAGE_BYTES
    for fragment in fragments:
        assert fragment in details, details
    return details


@pytest.mark.parametrize("name", HUGE, ids=["ascii", "emoji"])
async def test_huge_model_names_get_not_found_with_the_length(server, name):
    length = f"({len(name)} characters)"
    await expect(
        server.models.GetModel(pb.GetModelRequest(name=name)),
        grpc.StatusCode.NOT_FOUND,
        "unknown model",
        length,
        "available models",
    )
    await expect(
        server.embedding.Embed(pb.EmbedRequest(inputs=["hi"], model=name)),
        grpc.StatusCode.NOT_FOUND,
        length,
        "tiny-embed",
    )
    await expect(
        server.generation.Generate(pb.GenerateRequest(prompt="hi", model=name)),
        grpc.StatusCode.NOT_FOUND,
        length,
        "tiny-gpt",
    )
    await expect(
        server.translation.Translate(pb.TranslateRequest(inputs=["hi"], model=name)),
        grpc.StatusCode.NOT_FOUND,
        length,
        "tiny-translate",
    )
    stream = server.generation.GenerateStream(pb.GenerateRequest(prompt="hi", model=name))
    await expect(stream.read(), grpc.StatusCode.NOT_FOUND, length)


async def test_huge_bad_values_get_invalid_argument(server):
    huge_stop = "s" * 100_000
    await expect(
        server.generation.Generate(pb.GenerateRequest(prompt="hi", stop=[huge_stop])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "stop[0] is 100000 characters",
    )
    await expect(
        server.generation.Generate(pb.GenerateRequest(prompt="hi", stop=["a"] * 10_000)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "stop sequences",
    )
    await expect(
        server.embedding.Embed(pb.EmbedRequest(inputs=["x"] * 100_000)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "100000 inputs",
    )
    await expect(
        server.embedding.Embed(pb.EmbedRequest(inputs=["hi"], dimensions=2**32 - 1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "dimensions",
    )
    await expect(
        server.translation.Translate(pb.TranslateRequest(inputs=["hi"], beam_size=2**32 - 1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "beam_size",
    )


async def test_model_of_another_kind_is_quoted(server):
    await expect(
        server.embedding.Embed(pb.EmbedRequest(inputs=["hi"], model="tiny-gpt")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "'tiny-gpt' is a generation model",
    )
