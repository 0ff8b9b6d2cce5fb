"""Packed embeddings: EMBEDDING_ENCODING_PACKED_FLOAT32 carries the very bits of the float values."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from client import AsyncClient, array, embed_request

TEXTS = ["a short one", "a somewhat longer sentence to embed, with punctuation!", "ünïcödé ✓"]


@pytest.mark.parametrize("options", [{}, {"dimensions": 5}, {"normalize": False}])
async def test_packed_equals_float_values_bit_for_bit(server, options):
    floats = await server.embedding.Embed(embed_request(TEXTS, **options))
    packed = await server.embedding.Embed(embed_request(TEXTS, packed=True, **options))
    assert all(not e.values for e in packed.embeddings) and all(not e.packed for e in floats.embeddings)
    from_values = np.array([e.values for e in floats.embeddings], dtype=np.float32)  # (N, D)
    from_bytes = np.stack([np.frombuffer(e.packed, dtype="<f4") for e in packed.embeddings])  # (N, D)
    assert from_bytes.shape == from_values.shape == (len(TEXTS), options.get("dimensions", from_values.shape[1]))
    np.testing.assert_array_equal(from_bytes.view(np.uint32), from_values.view(np.uint32))
    np.testing.assert_array_equal(array(packed), array(floats))


async def test_clients_read_packed_vectors(server):
    async with AsyncClient(server.address) as client:
        matrix = await client.embed_array(TEXTS)
        lists = await client.embed(TEXTS)
    floats = await server.embedding.Embed(embed_request(TEXTS))
    np.testing.assert_array_equal(matrix, np.array([e.values for e in floats.embeddings], dtype=np.float32))
    assert lists == matrix.tolist()


async def test_unknown_encoding_is_invalid_argument(server):
    request = embed_request(TEXTS)
    request.encoding = 7  # proto3 enums are open: any number arrives
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await server.embedding.Embed(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "EMBEDDING_ENCODING_PACKED_FLOAT32" in err.value.details()
