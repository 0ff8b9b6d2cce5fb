"""Embeddings in this process from a model directory, with the service's own code: no server, no torch.

    embedder = LocalEmbedder(load_model_dir("models/all-minilm-l6-v2"), LocalOptions(threads=1))
    vectors = embedder.embed(["hello world", "good morning"])      # (2, 384) float32

The pieces are EmbeddingModel's (service/embedding/model.py): `load_engine` (the variant the
service would serve, `Runtime.choose_variant`, or the one named; its packed or padded graph as the
service picks; the session from `Runtime.create_session`, strict: a CUDA request that onnxruntime
would silently run on the CPU is refused), `EmbeddingTokenizer` (truncation to the manifest's limit)
and `postprocess` (dimensions, then L2 normalisation). So the vectors equal the service's Embed with
the same options. The service's queue is left out: `embed` tokenizes every text, sorts them by token
count, runs batches of `batch_size` texts (little padding: /work/shared/FACTS.md) and puts them back
in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.embedding.engine import postprocess
from service.embedding.model import load_engine
from service.embedding.tokenization import EmbeddingTokenizer
from service.manifest import Manifest, ModelDir
from service.runtime import CUDA, ProviderError, Runtime
from service.settings import Settings


@dataclass(frozen=True)
class LocalOptions:
    device: str = "cpu"  # cpu | cuda (CUDA or an error, never a silent CPU fallback)
    variant: str = "auto"  # as the service's `variant` setting
    threads: int = 1  # onnxruntime intra-op threads
    batch_size: int = 32  # rows per forward pass
    normalize: bool = True  # the service's defaults
    dimensions: int = 0


def check_options(m: Manifest, options: LocalOptions) -> None:
    """Raises ValueError for options model `m` cannot take (a driver checks before any actor starts)."""
    if m.kind != "embedding":
        raise ValueError(f"model {m.name!r} is a {m.kind} model, not an embedding model")
    if options.dimensions > (m.embedding_dim or 0):
        raise ValueError(f"dimensions={options.dimensions} is larger than model {m.name!r}'s {m.embedding_dim}")
    if options.variant != "auto" and options.variant not in m.variants("encoder"):
        raise ValueError(f"model {m.name!r} has no {options.variant} encoder graph "
                         f"(has: {', '.join(m.variants('encoder'))})")


def check_cuda() -> None:
    """Raises ProviderError unless this onnxruntime offers CUDA (onnxruntime-gpu)."""
    if CUDA not in ort.get_available_providers():
        raise ProviderError(f"device cuda: this onnxruntime offers only {', '.join(ort.get_available_providers())}; "
                            "install onnxruntime-gpu instead of onnxruntime (never both)")


class LocalEmbedder:
    def __init__(self, model_dir: ModelDir, options: LocalOptions):
        m = model_dir.manifest
        check_options(m, options)
        if options.device == "cuda":
            check_cuda()
        settings = Settings.from_env(env={}, device=options.device, variant=options.variant, strict_provider=True,
                                     intra_op_threads=options.threads, compute_workers=1)
        runtime = Runtime(settings)
        try:
            self.variant, self.engine = load_engine(model_dir, settings, runtime)
        finally:
            runtime.close()
        self.name, self.options, self.provider = m.name, options, runtime.provider
        self.tokenizer = EmbeddingTokenizer(model_dir.file(m.tokenizer["file"]), m.max_input_tokens)
        self.width = int(m.embedding_dim)  # C: the graph's pooled output
        self.dimension = options.dimensions or self.width

    def embed(self, texts: list[str]) -> np.ndarray:
        """(N, dimension) float32 in input order; texts over the model's limit are truncated."""
        encoded = self.tokenizer.encode(texts, truncate=True, parallel=False)
        pooled = np.zeros((len(encoded), self.width), dtype=np.float32)  # (N, C)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        size = self.options.batch_size
        for start in range(0, len(order), size):
            rows = order[start:start + size]
            pooled[rows] = self.engine.forward([encoded[i] for i in rows])  # (B, C)
        return postprocess(pooled, self.options.normalize, self.options.dimensions)  # (N, D)
