"""`EmbeddingModel`: the registry backend for kind "embedding" (tokenizer + engine + batcher).

`embed()` takes plain values from the embedding core (core.py) and returns an `EmbedResult`: take
the call's queue places (`batcher.admission`, refused at once when full), tokenize (inline for small
calls, in a thread for large ones; an untruncated input too long to hold is refused before), queue
through the batcher, then truncate dimensions / normalise in numpy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.embedding.engine import EmbeddingEngine, EncoderEngine, PackedEmbeddingEngine, postprocess
from service.embedding.prompts import Prompts
from service.engine.batcher import Batcher, BatchLimits
from service.engine.layout import encoder_engine
from service.engine.packing import alignment
from service.engine.tokenization import EmbeddingTokenizer, Encoded
from service.errors import InvalidArgument
from service.manifest import Manifest, ModelDir
from service.registry import model_info
from service.runtime import Runtime
from service.settings import Settings

log = logging.getLogger(__name__)


def queue_limits(settings: Settings, runtime: Runtime) -> BatchLimits:
    """The embedding queue's limits (settings `embed_*`, batch sizes by device): every encoder kind's."""
    max_tokens, max_rows = runtime.embed_batch_limits()
    return BatchLimits(
        max_batch_tokens=max_tokens,
        max_batch_size=max_rows,
        max_wait_s=settings.embed_max_wait_ms / 1000.0,
        max_queue=settings.embed_max_queue,
        workers=settings.compute_workers,
        grace_s=settings.grace_seconds,
    )


def load_engine(model_dir: ModelDir, settings: Settings, runtime: Runtime) -> tuple[str, EncoderEngine[np.ndarray]]:
    """(variant, engine) of an embedding model, packed or padded as service/engine/layout.py
    chooses. Also the engine of the batch job's Ray actors (service/batch/local.py)."""
    m = model_dir.manifest
    pad = int(m.special_tokens.get("pad", 0))

    def build(layout: str, session: ort.InferenceSession, variant: str) -> EncoderEngine[np.ndarray]:
        if layout == "packed":
            return PackedEmbeddingEngine(
                session, pad, settings.embed_pack_row_tokens, m.pooling or "mean", m.name, alignment(variant)
            )
        return EmbeddingEngine(session, pad, m.name)

    return encoder_engine(model_dir, settings, runtime, build)


async def admit_and_encode(
    batcher: Batcher,
    tokenizer: EmbeddingTokenizer,
    texts: list[str],
    truncate: bool,
    check: Callable[[list[Encoded]], None] | None = None,
) -> tuple[list[Encoded], float]:
    """Takes the call's queue places (refused at once when full), refuses untruncated inputs too long
    to tokenize, then tokenizes the call (inline when small, else in a thread) and runs `check` on
    the result; gives the places back on any failure. -> (encodings, seconds spent tokenizing)."""
    batcher.admission.take(len(texts))
    start = time.perf_counter()
    try:
        encoded = await tokenizer.encode_checked(texts, truncate, batcher.model)
        if check is not None:
            check(encoded)
    except BaseException:
        batcher.admission.release(len(texts))
        raise
    return encoded, time.perf_counter() - start


def check_dimensions(model: str, dimension: int, dimensions: int) -> None:
    """Refuses a truncation to more dimensions than the model's."""
    if dimensions > dimension:
        raise InvalidArgument(
            f"dimensions={dimensions} is larger than model {model!r}'s {dimension}; use 0 (full) or 1..{dimension}"
        )


@dataclass(frozen=True)
class EmbedResult:
    embeddings: np.ndarray  # (N, D) float32, in input order
    input_tokens: int
    tokenize_s: float
    queue_s: float
    inference_s: float


class EmbeddingModel:
    kind = "embedding"

    def __init__(
        self,
        manifest: Manifest,
        tokenizer: EmbeddingTokenizer,
        engine: EncoderEngine[np.ndarray],
        runtime: Runtime,
        limits: BatchLimits,
        variant: str,
    ):
        self.name, self.manifest, self.variant = manifest.name, manifest, variant
        self.tokenizer, self.engine, self.runtime = tokenizer, engine, runtime
        self.provider = engine.provider
        self.dimension = int(manifest.embedding_dim or 0)
        self.prompts = Prompts.of(manifest)
        self.batcher = Batcher(
            self.name, engine.forward, runtime.run, limits, gate=runtime.gate, packed=lambda: engine.packed
        )

    @classmethod
    def load(cls, model_dir: ModelDir, settings: Settings, runtime: Runtime) -> EmbeddingModel:
        m = model_dir.manifest
        variant, engine = load_engine(model_dir, settings, runtime)
        tokenizer = EmbeddingTokenizer(model_dir.file(m.tokenizer["file"]), m.max_input_tokens)
        return cls(m, tokenizer, engine, runtime, queue_limits(settings, runtime), variant)

    async def start(self) -> None:
        self.batcher.start()

    async def warmup(self) -> None:
        """One real forward pass through the executor; raises if the graph cannot run."""
        out = await self.runtime.run(self.engine.forward, self.tokenizer.encode(["warm-up"]))
        if out.shape != (1, self.dimension) or not np.isfinite(out).all():
            raise RuntimeError(f"model {self.name!r}: warm-up gave shape {out.shape}, expected (1, {self.dimension})")

    async def stop(self) -> None:
        await self.batcher.stop()

    def info(self) -> dict:
        info = model_info(self, vocab_size=self.tokenizer.vocab_size)
        info["manifest"]["serving.execution"] = self.engine.layout
        info["manifest"]["serving.execution_chosen_by"] = self.engine.chosen_by
        if self.prompts.texts:
            info["manifest"]["prompts"] = json.dumps(self.prompts.texts, ensure_ascii=False)
            info["manifest"]["default_prompt_name"] = self.prompts.default or ""
        return info

    async def embed(
        self,
        texts: list[str],
        normalize: bool = True,
        truncate: bool = True,
        dimensions: int = 0,
        deadline: float | None = None,
    ) -> EmbedResult:
        """Embeds texts; `deadline` is a time.monotonic() instant after which queued work is dropped."""
        check_dimensions(self.name, self.dimension, dimensions)
        encoded, tokenize_s = await admit_and_encode(self.batcher, self.tokenizer, texts, truncate)
        outcome = await self.batcher.enqueue(encoded, deadline)
        vectors = postprocess(outcome.outputs, normalize, dimensions)
        return EmbedResult(vectors, outcome.input_tokens, tokenize_s, outcome.queue_s, outcome.inference_s)
