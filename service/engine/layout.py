"""Packed or padded: the layout an encoder kind's batches run in, chosen at load by measurement.

An embedding, fill-mask or classification model directory may hold, per variant, a padded graph
(role `encoder`: each batch padded to its longest input) and a packed one (role `packed`: several
inputs side by side in rows of `embed_pack_row_tokens`; docs/design/packing.md). Which is faster
depends on the model, the variant and the CPU: packed fp32 wins on MiniLM here, packed int8 cost
1.75x padded int8 on a BERT-base cross-encoder (docs/performance.md). So with `encoder_layout`
auto (the default) and both graphs present, the load times both engines on one batch of
16 inputs of mixed length (sentences of 9-60 tokens for embedding and fill-mask, what 16
concurrent one-sentence calls make; a query with passages of 25-170 tokens for classification),
the layouts alternated over `ROUNDS` rounds after a warm-up, and serves the faster by median; the
other session is dropped. ListModels says which and why (`serving.execution`,
`serving.execution_chosen_by`). `encoder_layout` packed | padded takes one without measuring;
`embed_pack_row_tokens` 0 means padded. The batch stands for typical traffic; it is not the
traffic: which layout wins turns on the inputs' lengths (a BERT-base int8 cross-encoder here:
packed 184 against padded 283 ms on the sentences, 903 against 1182 on the 37-180-token pairs,
but 261 against 186 on pairs of 25-41 tokens and 679 against 468 on 49-90: packing gains where
lengths vary and loses where they are alike), so a deployment whose inputs differ pins it.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from service.engine.tokenization import Encoded
from service.manifest import PACKED_ROLE, ModelDir
from service.runtime import Runtime
from service.settings import Settings

if TYPE_CHECKING:  # service.embedding imports this module
    from service.embedding.engine import EncoderEngine

log = logging.getLogger(__name__)

# Tokens per input (special tokens included) of the timed batch: sentences of 9-60 tokens, as a
# burst of single-sentence calls batches them (embedding, fill-mask) ...
SAMPLE_LENGTHS = (12, 18, 25, 9, 40, 14, 31, 22, 60, 16, 11, 27, 35, 20, 48, 13)
# ... and a short query with passages of 25-170 tokens (classification: rerank, score, classify).
PAIR_LENGTHS = (42, 75, 130, 58, 96, 160, 37, 88, 120, 66, 142, 51, 104, 79, 180, 62)
ROUNDS = 5

Build = Callable[[str, ort.InferenceSession, str], "EncoderEngine"]  # (layout, session, variant) -> engine


def sample_batch(
    vocab: int,
    longest: int,
    decorate: Callable[[list[int]], list[int]] | None = None,
    lengths: tuple[int, ...] = SAMPLE_LENGTHS,
) -> list[Encoded]:
    """The timed batch: token ids drawn (seeded) from the upper half of the vocabulary, `lengths`
    capped at `longest`; `decorate` may edit each input's ids (fill-mask's mask)."""
    rng = np.random.default_rng(0)
    out = []
    for n in lengths:
        ids = rng.integers(vocab // 2, vocab, size=max(2, min(n, longest))).tolist()
        ids = decorate(ids) if decorate else ids
        out.append(Encoded(ids, [0] * len(ids)))
    return out


def timed(engines: dict[str, EncoderEngine], batch: list[Encoded], rounds: int = ROUNDS) -> dict[str, float]:
    """Median ms of one forward pass of the batch per engine, alternated after a warm-up; the
    passes are not counted in the token metrics."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():
        engine.counted = False
    try:
        for engine in engines.values():
            engine.forward(batch)
        for _ in range(rounds):
            for name, engine in engines.items():
                start = time.perf_counter()
                engine.forward(batch)
                times[name].append((time.perf_counter() - start) * 1e3)
    finally:
        for engine in engines.values():
            engine.counted = True
    return {name: statistics.median(t) for name, t in times.items()}


def encoder_engine(
    model_dir: ModelDir,
    settings: Settings,
    runtime: Runtime,
    build: Build,
    decorate: Callable[[list[int]], list[int]] | None = None,
    lengths: tuple[int, ...] = SAMPLE_LENGTHS,
) -> tuple[str, EncoderEngine]:
    """(variant, engine) of an encoder kind: its variant's packed or padded graph (module doc);
    the engine's `chosen_by` says why that layout."""
    m = model_dir.manifest
    variant = runtime.choose_variant(m, "encoder")

    def make(layout: str) -> EncoderEngine:
        graph = m.graph(PACKED_ROLE if layout == "packed" else "encoder", variant)
        return build(layout, runtime.create_session(model_dir.file(graph.file)), variant)

    if variant not in m.variants(PACKED_ROLE):
        engine, why = make("padded"), "the only graph (no packed graph of this variant)"
    elif not settings.embed_pack_row_tokens:
        engine, why = make("padded"), "settings (embed_pack_row_tokens 0)"
    elif settings.encoder_layout != "auto":
        engine, why = make(settings.encoder_layout), f"settings (encoder_layout {settings.encoder_layout})"
    else:
        engines = {layout: make(layout) for layout in ("packed", "padded")}
        vocab = int(m.architecture.get("vocab_size") or 1000)
        batch = sample_batch(vocab, int(m.max_input_tokens or max(lengths)), decorate, lengths)
        ms = timed(engines, batch)
        layout = min(ms, key=lambda k: ms[k])
        engine = engines[layout]
        span = f"{min(map(len, batch))}-{max(map(len, batch))}"
        why = (
            f"measured at load: packed {ms['packed']:.2f} ms, padded {ms['padded']:.2f} ms a batch of "
            f"{len(batch)} inputs of {span} tokens ({variant}, median of {ROUNDS})"
        )
    engine.chosen_by = why
    log.info("%s model %s: %s %s graph: %s", m.kind, m.name, variant, "packed" if engine.packed else "padded", why)
    return variant, engine
