"""`ClassificationModel`: the registry backend for kind "classification" (pair tokenizer + engine + batcher).

`logits()` takes plain values from the classification core (core.py): a list of texts or (text,
pair) inputs. It takes the call's queue places first (`batcher.admission`, refused at once when
full; more than the queue holds: INVALID_ARGUMENT), tokenizes (service/classification/tokenization.py),
queues the inputs through the same token-budget batcher as Embed (settings `embed_*`: one query
with N documents is N inputs, batched with any other call's; packed rows when the directory has
the packed graph and `embed_pack_row_tokens` is not 0, else padded) and returns (N, labels) logits
in input order. Each input attends only to its own tokens (a per-row mask, or its segment in a
packed row), so its logits do not depend on what it was batched with.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.classification.engine import ClassifierEngine, PackedClassifierEngine
from service.classification.tokenization import Input, PairTokenizer
from service.embedding.model import queue_limits
from service.engine.batcher import Batcher, BatchLimits
from service.engine.layout import PAIR_LENGTHS, encoder_engine
from service.engine.packing import alignment
from service.manifest import Manifest, ModelDir
from service.registry import model_info
from service.runtime import Runtime
from service.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogitsResult:
    logits: np.ndarray  # (N, L) float32, in input order
    input_tokens: int
    tokenize_s: float
    queue_s: float
    inference_s: float


class ClassificationModel:
    kind = "classification"

    def __init__(
        self,
        manifest: Manifest,
        tokenizer: PairTokenizer,
        engine: ClassifierEngine | PackedClassifierEngine,
        runtime: Runtime,
        limits: BatchLimits,
        variant: str,
    ):
        self.name, self.manifest, self.variant = manifest.name, manifest, variant
        self.tokenizer, self.engine, self.runtime = tokenizer, engine, runtime
        self.provider = engine.provider
        self.labels: list[str] = list(manifest.extra["labels"])
        self.activation: str = manifest.extra["activation"]
        self.batcher = Batcher(
            self.name,
            engine.forward,
            runtime.run,
            limits,
            kind="classification",
            gate=runtime.gate,
            packed=lambda: engine.packed,
        )

    @classmethod
    def load(cls, model_dir: ModelDir, settings: Settings, runtime: Runtime) -> ClassificationModel:
        m = model_dir.manifest
        pad = int(m.special_tokens.get("pad", 0))

        def build(
            layout: str, session: ort.InferenceSession, variant: str
        ) -> ClassifierEngine | PackedClassifierEngine:
            if layout == "packed":
                return PackedClassifierEngine(session, pad, settings.embed_pack_row_tokens, m.name, alignment(variant))
            return ClassifierEngine(session, pad, m.name)

        variant, engine = encoder_engine(model_dir, settings, runtime, build, lengths=PAIR_LENGTHS)
        tokenizer = PairTokenizer(
            model_dir.file(m.tokenizer["file"]), m.max_input_tokens, m.extra.get("truncation", "longest_first")
        )
        log.info("classification model %s: labels %s", m.name, m.extra["labels"])
        return cls(m, tokenizer, engine, runtime, queue_limits(settings, runtime), variant)

    async def start(self) -> None:
        self.batcher.start()

    async def warmup(self) -> None:
        """One real forward pass of a pair through the executor; raises if the graph cannot run."""
        out = await self.runtime.run(self.engine.forward, self.tokenizer.encode([("warm", "up")]))
        if out.shape != (1, len(self.labels)) or not np.isfinite(out).all():
            raise RuntimeError(
                f"model {self.name!r}: warm-up gave logits of shape {out.shape}, expected (1, {len(self.labels)})"
            )

    async def stop(self) -> None:
        await self.batcher.stop()

    def info(self) -> dict:
        info = model_info(self, vocab_size=self.tokenizer.vocab_size)
        info["manifest"].update({"labels": ",".join(self.labels), "activation": self.activation})
        info["manifest"]["serving.execution"] = self.engine.layout
        info["manifest"]["serving.execution_chosen_by"] = self.engine.chosen_by
        return info

    async def logits(
        self, inputs: list[Input], truncate: bool, what: str, deadline: float | None = None
    ) -> LogitsResult:
        """(N, L) logits of the inputs; `deadline`: time.monotonic() after which queued work is dropped."""
        self.batcher.admission.take(len(inputs))
        start = time.perf_counter()
        try:
            if not truncate:
                self.tokenizer.check_chars(inputs, what, self.name)
            encoded = await self.tokenizer.encode_async(inputs, truncate, what)
        except BaseException:
            self.batcher.admission.release(len(inputs))
            raise
        tokenize_s = time.perf_counter() - start
        outcome = await self.batcher.enqueue(encoded, deadline)
        return LogitsResult(outcome.outputs, outcome.input_tokens, tokenize_s, outcome.queue_s, outcome.inference_s)
