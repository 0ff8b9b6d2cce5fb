"""The model in this process, as the service runs it: the Ray engine's embedder (no server, no torch).

    embedder = LocalEmbedder(find_model(Path("models"), ""), LocalOptions(threads=1))
    vectors = embedder.embed(["hello world", "good morning"])      # (2, 384) float32

The one module of client/ that imports the serving package beyond its stubs, on purpose: the Ray
actors must compute what Embed computes, so they run the service's own pieces rather than a copy:
the manifest, the variant `Runtime` picks, the packed or padded graph `load_engine` opens (with a
strict provider), `EmbeddingTokenizer` and `postprocess`. Everything else under client/batch/ reaches
the service through this module. The service's queue is left out: `embed` sorts texts by token
count and runs batches of `batch_size`, then puts them back in order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.embedding.engine import postprocess
from service.embedding.model import load_engine
from service.engine.tokenization import EmbeddingTokenizer
from service.manifest import MANIFEST_FILE, Manifest, ModelDir, ModelDirError, discover, load_model_dir
from service.runtime import CUDA, ProviderError, Runtime
from service.settings import VARIANT_CHOICES, Settings

__all__ = [
    "VARIANT_CHOICES",
    "LocalEmbedder",
    "LocalOptions",
    "ModelDir",
    "ProviderError",
    "check_cuda",
    "check_options",
    "find_model",
    "load_model_dir",
    "manifest_sha256",
]


@dataclass(frozen=True)
class LocalOptions:
    device: str = "cpu"  # cpu | cuda (CUDA or an error, never a silent CPU fallback)
    variant: str = "auto"  # as the service's `variant` setting
    threads: int = 1  # onnxruntime intra-op threads
    batch_size: int = 32  # rows per forward pass
    normalize: bool = True  # the service's defaults
    dimensions: int = 0


def find_model(models: Path, name: str) -> ModelDir:
    """The embedding model `name` under `models` (a model directory itself, or a folder of them);
    no name: the one whose manifest says `extra.default`, else the first by name (as the service)."""
    dirs = [models] if (models / MANIFEST_FILE).is_file() else discover(models)
    found = [d for d in (load_model_dir(p, verify_hashes=False) for p in dirs) if d.manifest.kind == "embedding"]
    if name:
        found = [d for d in found if name in (d.manifest.name, d.path.name)]
    else:
        found.sort(key=lambda d: (d.manifest.extra.get("default") is not True, d.manifest.name))
    if not found:
        raise ModelDirError(
            f"no embedding model {name + ' ' if name else ''}under {models} "
            "(pass --models DIR, --model NAME; `make models` builds the default ones)"
        )
    return load_model_dir(found[0].path)


def manifest_sha256(model_dir: ModelDir) -> str:
    """Names the model's exact build (a resumed job must use the same one)."""
    return hashlib.sha256((model_dir.path / MANIFEST_FILE).read_bytes()).hexdigest()


def check_options(m: Manifest, options: LocalOptions) -> None:
    """Raises ValueError for options model `m` cannot take (a driver checks before any actor starts)."""
    if m.kind != "embedding":
        raise ValueError(f"model {m.name!r} is a {m.kind} model, not an embedding model")
    if not m.embedding_dim:
        raise ValueError(f"model {m.name!r}: its manifest gives no embedding_dim")
    if options.dimensions > (m.embedding_dim or 0):
        raise ValueError(f"dimensions={options.dimensions} is larger than model {m.name!r}'s {m.embedding_dim}")
    if options.variant != "auto" and options.variant not in m.variants("encoder"):
        raise ValueError(
            f"model {m.name!r} has no {options.variant} encoder graph (has: {', '.join(m.variants('encoder'))})"
        )


def check_cuda() -> None:
    """Raises ProviderError unless this onnxruntime offers CUDA (onnxruntime-gpu)."""
    if CUDA not in ort.get_available_providers():
        raise ProviderError(
            f"device cuda: this onnxruntime offers only {', '.join(ort.get_available_providers())}; "
            "install onnxruntime-gpu instead of onnxruntime (never both)"
        )


class LocalEmbedder:
    def __init__(self, model_dir: ModelDir, options: LocalOptions):
        m = model_dir.manifest
        check_options(m, options)
        if options.device == "cuda":
            check_cuda()
        settings = Settings.from_env(
            env={},
            device=options.device,
            variant=options.variant,
            strict_provider=True,
            intra_op_threads=options.threads,
            compute_workers=1,
        )
        runtime = Runtime(settings)
        try:
            self.variant, self.engine = load_engine(model_dir, settings, runtime)
        finally:
            runtime.close()
        self.name, self.options, self.provider = m.name, options, runtime.provider
        self.tokenizer = EmbeddingTokenizer(model_dir.file(m.tokenizer["file"]), m.max_input_tokens)
        self.width = int(m.embedding_dim or 0)  # C: the graph's pooled output (check_options: > 0)
        self.dimension = options.dimensions or self.width

    def embed(self, texts: list[str]) -> np.ndarray:
        """(N, dimension) float32 in input order; texts over the model's limit are truncated."""
        encoded = self.tokenizer.encode(texts, truncate=True, parallel=False)
        pooled = np.zeros((len(encoded), self.width), dtype=np.float32)  # (N, C)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        size = self.options.batch_size
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            pooled[rows] = self.engine.forward([encoded[i] for i in rows])  # (B, C)
        return postprocess(pooled, self.options.normalize, self.options.dimensions)  # (N, D)
