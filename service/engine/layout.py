"""Packed or padded: the layout an encoder kind's batches run in, chosen by measurement.

An embedding, fill-mask or classification model directory may hold, per variant, a padded graph
(role `encoder`: each batch padded to its longest input) and a packed one (role `packed`: several
inputs side by side in rows of `embed_pack_row_tokens`; docs/design/packing.md). Which is faster
turns on the model, the variant, the CPU and the inputs' lengths. A BERT-base int8 cross-encoder
here: packed 184 against padded 283 ms on 16 sentences of 9-60 tokens, 903 against 1182 on
pairs of 37-180 tokens, but 261 against 186 on pairs of 25-41 tokens and 679 against 468 on
49-90: packing gains where lengths vary and loses where they are alike.

So with `encoder_layout` auto (the default) and both graphs present, the load times both
engines on one batch of 16 inputs (sentences of 9-60 tokens for embedding and fill-mask, what
16 one-sentence calls make; a query with passages of 25-170 tokens for classification), the
layouts alternated over `ROUNDS` rounds after a warm-up, and serves the faster first. From then
on `AdaptiveEncoder` times both on the traffic itself (a few batches each, then one batch in 50
on the other layout, or fewer the more it costs: exploring costs at most 1 %) and serves the one
cheaper per real token. ListModels says which and why
(`serving.execution`, `serving.execution_chosen_by`). `encoder_layout` packed | padded takes one
without measuring; `embed_pack_row_tokens` 0 means padded.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import onnxruntime as ort

from service.engine.tokenization import Encoded
from service.manifest import PACKED_ROLE, ModelDir
from service.runtime import Runtime
from service.settings import Settings


class LayoutEngine(Protocol):
    """What this module needs of an encoder kind's engine (service.embedding.engine.EncoderEngine,
    which imports this layer: the engine layer names no kind)."""

    counted: bool
    chosen_by: str
    provider: str

    @property
    def layout(self) -> str: ...

    def forward(self, batch: list[Encoded]) -> Any: ...


log = logging.getLogger(__name__)

# Tokens per input (special tokens included) of the timed batch: sentences of 9-60 tokens, as a
# burst of single-sentence calls batches them (embedding, fill-mask) ...
SAMPLE_LENGTHS = (12, 18, 25, 9, 40, 14, 31, 22, 60, 16, 11, 27, 35, 20, 48, 13)
# ... and a short query with passages of 25-170 tokens (classification: rerank, score, classify).
PAIR_LENGTHS = (42, 75, 130, 58, 96, 160, 37, 88, 120, 66, 142, 51, 104, 79, 180, 62)
ROUNDS = 5

E = TypeVar("E", bound=LayoutEngine)  # the kind's engine type


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


def timed(engines: Mapping[str, LayoutEngine], batch: list[Encoded], rounds: int = ROUNDS) -> dict[str, float]:
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


# Providers on which a padded batch may run in several passes: a CPU's cost grows with the tokens
# computed; a GPU's passes want whole batches (one launch sequence and one sync each).
SPLIT_PROVIDERS = ("CPUExecutionProvider",)
PASS_ROUNDS = 3


def measure_pass(engine: Any, batch: list[Encoded], rounds: int = PASS_ROUNDS) -> float | None:
    """What one more session pass of a padded engine costs, in padded tokens, on this model and
    CPU (its `pass_tokens`): the batch as one pass takes F + c * rows * longest, its inputs one by
    one rows * F + c * (sum of lengths); medians of `rounds`, alternated after a warm-up -> F / c.
    None where the figures give no positive cost per token (noise), so that batches stay whole."""
    engine.pass_tokens, engine.counted = None, False
    whole: list[float] = []
    alone: list[float] = []
    try:
        engine.forward(batch)
        for _ in range(rounds):
            start = time.perf_counter()
            engine.forward(batch)
            whole.append(time.perf_counter() - start)
            start = time.perf_counter()
            for e in batch:
                engine.forward([e])
            alone.append(time.perf_counter() - start)
    finally:
        engine.counted = True
    rows, padded, real = len(batch), len(batch) * max(map(len, batch)), sum(map(len, batch))
    one, each = statistics.median(whole), statistics.median(alone)
    if rows < 2 or padded == real:
        return None
    per_token = (rows * one - each) / (rows * padded - real)
    if per_token <= 0:
        return None
    return max(0.0, one - per_token * padded) / per_token


def encoder_engine(
    model_dir: ModelDir,
    settings: Settings,
    runtime: Runtime,
    build: Callable[[str, ort.InferenceSession, str], E],  # (layout, session, variant) -> engine
    decorate: Callable[[list[int]], list[int]] | None = None,
    lengths: tuple[int, ...] = SAMPLE_LENGTHS,
) -> tuple[str, E]:
    """(variant, engine) of an encoder kind: its variant's packed or padded graph (module doc);
    the engine's `chosen_by` says why that layout."""
    m = model_dir.manifest
    variant = runtime.choose_variant(m, "encoder")
    vocab = int(m.architecture.get("vocab_size") or 1000)
    batch = sample_batch(vocab, int(m.max_input_tokens or max(lengths)), decorate, lengths)
    runs = ""  # how the padded engine splits its batches, when it does

    def make(layout: str) -> E:
        nonlocal runs
        graph = m.graph(PACKED_ROLE if layout == "packed" else "encoder", variant)
        engine = build(layout, runtime.create_session(model_dir.file(graph.file)), variant)
        if layout == "padded" and getattr(engine, "runs_by_length", False) and engine.provider in SPLIT_PROVIDERS:
            cost = measure_pass(engine, batch)
            engine.pass_tokens = cost  # type: ignore[attr-defined]
            runs = (
                f"; padded batches run in passes of similar length (a pass costs {cost:.0f} tokens, measured at load)"
                if cost is not None
                else "; padded batches run whole (a pass's cost did not measure)"
            )
        return engine

    if variant not in m.variants(PACKED_ROLE):
        engine = make("padded")
        why = "the only graph (no packed graph of this variant)" + runs
    elif not settings.embed_pack_row_tokens:
        engine = make("padded")
        why = "settings (embed_pack_row_tokens 0)" + runs
    elif settings.encoder_layout != "auto":
        engine = make(settings.encoder_layout)
        why = f"settings (encoder_layout {settings.encoder_layout})" + runs
    else:
        engines = {layout: make(layout) for layout in ("packed", "padded")}
        ms = timed(engines, batch)
        span = f"{min(map(len, batch))}-{max(map(len, batch))}"
        why = (
            f"measured at load: packed {ms['packed']:.2f} ms, padded {ms['padded']:.2f} ms a batch of "
            f"{len(batch)} inputs of {span} tokens ({variant}, median of {ROUNDS}){runs}"
        )
        adaptive = AdaptiveEncoder(engines, min(ms, key=lambda k: ms[k]), why, m.name)
        log.info("%s model %s: %s, %s graph first: %s", m.kind, m.name, variant, adaptive.layout, why)
        return variant, cast(E, adaptive)
    engine.chosen_by = why
    log.info("%s model %s: %s %s graph: %s", m.kind, m.name, variant, engine.layout, why)
    return variant, engine


WINDOW = 32  # a layout's cost: the median over its last WINDOW timed batches
MIN_SAMPLES = 8  # batches of each before the served layout may change ...
CLEAR_AFTER = 3  # ... or this many, where one layout costs CLEARLY times the other's per token
CLEARLY = 2.0
EXPLORE_EVERY = 50  # then one batch in EXPLORE_EVERY runs the other layout, or fewer (explore_every)
EXPLORE_BUDGET = 0.01  # exploring costs at most this much more than serving the cheaper layout alone
MAX_EXPLORE_EVERY = 1000
SWITCH_BELOW = 0.85  # the other layout serves once its cost is under 0.85x the served one's


def explore_every(ratio: float) -> int:
    """One batch in how many runs the other layout, where it costs `ratio` times the served one
    per token: 1 in 50, fewer as the gap grows so that exploring costs at most EXPLORE_BUDGET
    (a padded graph on arrival-order sentences costs ~3x a packed one: 1 batch in 240 then)."""
    return min(MAX_EXPLORE_EVERY, max(EXPLORE_EVERY, math.ceil((ratio - 1.0) / EXPLORE_BUDGET)))


class AdaptiveEncoder:
    """Both layouts' engines of one model, serving the one cheaper on the traffic itself: each
    batch's wall time per real token is kept per layout (the last WINDOW batches), the other
    layout runs on alternate batches until each has MIN_SAMPLES (CLEAR_AFTER where one costs
    CLEARLY times the other), then on one batch in `explore_every` of the cost ratio; the served
    layout changes when the other's median cost is under SWITCH_BELOW of its own. The load's
    timing only picks the first. The batcher forms batches for the served layout (`packed`, read
    per batch: oldest first with real tokens budgeted, or length-sorted with padding budgeted);
    an exploring batch runs the other layout on a batch formed for the served one. Thread-safe:
    batches run on several compute threads."""

    @property
    def packed(self) -> bool:  # the batcher's mode for the next batch
        return self.layout == "packed"

    def __init__(self, engines: Mapping[str, LayoutEngine], first: str, loaded: str, model: str):
        self.engines, self.layout, self.loaded, self.model = engines, first, loaded, model
        self.provider = engines[first].provider
        self.costs: dict[str, deque[float]] = {k: deque(maxlen=WINDOW) for k in engines}
        self.since = 0  # batches served since the other layout last ran
        self.runs = dict.fromkeys(engines, 0)  # batches each layout ran
        self._lock = threading.Lock()

    def __getattr__(self, name: str):  # what a kind reads of its engine (fill-mask's `keep`): the same in both
        if name == "engines":  # not set yet (copying): no recursion
            raise AttributeError(name)
        return getattr(self.engines["packed"], name)

    @property
    def chosen_by(self) -> str:
        with self._lock:
            seen = {k: (statistics.median(c) * 1e6, len(c)) for k, c in self.costs.items() if c}
        if not seen:
            return f"{self.loaded}; then by the traffic"
        figures = ", ".join(f"{k} {us:.2f} us a token ({n} batches)" for k, (us, n) in seen.items())
        return f"measured on the traffic: {figures}; first {self.loaded}"

    def forward(self, batch: list[Encoded]):
        with self._lock:
            served, other = self.layout, self._other()
            layout = other if self._explore() else served
            self.since = 0 if layout == other else self.since + 1
            self.runs[layout] += 1
        start = time.perf_counter()
        out = self.engines[layout].forward(batch)
        cost = (time.perf_counter() - start) / max(1, sum(len(e) for e in batch))
        with self._lock:
            self.costs[layout].append(cost)
            self._decide()
        return out

    def _other(self) -> str:
        return "padded" if self.layout == "packed" else "packed"

    def _ratio(self) -> float | None:
        """With the lock held: the other layout's median cost over the served one's, once each has
        CLEAR_AFTER batches."""
        mine, theirs = self.costs[self.layout], self.costs[self._other()]
        if min(len(mine), len(theirs)) < CLEAR_AFTER:
            return None
        return statistics.median(theirs) / statistics.median(mine)

    def _explore(self) -> bool:
        """With the lock held: whether the next batch runs the other layout."""
        mine, theirs, ratio = len(self.costs[self.layout]), len(self.costs[self._other()]), self._ratio()
        if theirs < MIN_SAMPLES and theirs <= mine and (ratio is None or ratio < CLEARLY):
            return True  # alternating until each has its samples, unless the other is clearly worse
        return self.since >= explore_every(ratio or 1.0)

    def _decide(self) -> None:
        """With the lock held: the other layout serves once it is clearly cheaper."""
        ratio = self._ratio()
        if ratio is None:
            return
        enough = min(len(c) for c in self.costs.values()) >= MIN_SAMPLES
        if (enough and ratio < SWITCH_BELOW) or ratio * CLEARLY <= 1.0:
            other = self._other()
            log.info(
                "model %s: %s serves from now on (%.2f us a token on the traffic against %s's %.2f)",
                self.model,
                other,
                statistics.median(self.costs[other]) * 1e6,
                self.layout,
                statistics.median(self.costs[self.layout]) * 1e6,
            )
            self.layout = other
            self.since = 0
