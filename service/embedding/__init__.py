"""Embeddings: tokenization, the onnxruntime engine, dynamic batching, and the registry backend."""

from service.embedding.model import EmbeddingModel, EmbedResult

__all__ = ["EmbedResult", "EmbeddingModel"]
