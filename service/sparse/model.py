"""`SparseEmbeddingModel`: the registry backend for kind "sparse-embedding" (SPLADE, export/onnx/sparse.py).

It is an embedding model (service/embedding/model.py: queue admission before tokenizing, the tokenizer
truncating at max_input_tokens, the batcher, the padded engine, instruction prompts) whose graph
returns (B, V) vocabulary weights instead of pooled hidden states: `embed` gives them unnormalised
and whole, and the sparse core (core.py) keeps each row's non-zero entries.
"""

from __future__ import annotations

from service.embedding.model import EmbeddingModel


class SparseEmbeddingModel(EmbeddingModel):
    kind = "sparse-embedding"
