"""The client of transformer-serving: Python clients, request builders, channels, the CLI
(`python -m client`, `ts-client`), the batch embedding job (`ts-embed-batch`) and attention figures.

    from client import Client
    with Client("127.0.0.1:50051") as c:
        vectors = c.embed(["hello world"])

It shares only the generated stubs (`service.proto`, the public contract) with the server; the
Ray engine of the batch job is the one exception (client/batch/local.py).
"""

from client.attention import attention_request
from client.channel import Credentials, open_channel
from client.classification import classify_request, rerank_request
from client.clients import DEFAULT_ADDRESS, AsyncClient, Client, array, embed_request, fill_mask_request, vectors
from client.generation import generate_request
from client.translation import translate_request

__all__ = [
    "DEFAULT_ADDRESS",
    "AsyncClient",
    "Client",
    "Credentials",
    "array",
    "attention_request",
    "classify_request",
    "embed_request",
    "fill_mask_request",
    "generate_request",
    "open_channel",
    "rerank_request",
    "translate_request",
    "vectors",
]
