"""Sparse embeddings (SPLADE): the embedding machinery over a graph of vocabulary weights (SparseEmbeddingService)."""

from service.sparse.model import SparseEmbeddingModel

__all__ = ["SparseEmbeddingModel"]
