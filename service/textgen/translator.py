"""`TranslationModel`: the registry backend for kind "translation" (encoder-decoder, greedy / beam).

`translate(inputs, options)` tokenizes every source, checks its length and queues one item per
source. One queue task per model (like the embedding batcher) takes items of the same beam size,
from one call or many, up to `translate_max_batch` decoder rows (sources x beams), runs the
encoder once for the batch, then greedy or beam search (service/textgen/search.py) with the
self-attention KV cache and the reused cross-attention K/V, and resolves each item's future.
Limits: a source may hold at most `max_input_tokens` tokens; beam_size at most
`translate_max_beam`; max_length 0 means `translate_default_max_length` (settings) or else the
model's `max_output_tokens`, and any value is capped by it and by the decoder's positions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from service import metrics
from service.errors import InvalidArgument, ResourceExhausted, Unavailable
from service.manifest import Manifest, ModelDir
from service.registry import model_info
from service.runtime import Runtime
from service.settings import Settings
from service.textgen.kvcache import GraphIO
from service.textgen.search import Seq2SeqState, beam_search, greedy_search
from service.textgen.sequence import Timings

log = logging.getLogger(__name__)

MAX_QUEUED_SOURCES = 4096  # beyond it RESOURCE_EXHAUSTED
MAX_INPUTS = 256  # sources in one call


@dataclass(frozen=True)
class TranslateOptions:
    beam_size: int = 1
    max_length: int = 0  # 0: the default
    length_penalty: float = 1.0


@dataclass(frozen=True)
class Translation:
    text: str
    score: float  # length-normalised log-probability
    token_ids: list[int] = field(default_factory=list)  # generated tokens, EOS included when it ended


@dataclass
class TranslateResult:
    translations: list[Translation]
    input_tokens: int
    output_tokens: int
    timings: Timings


@dataclass
class _Item:
    ids: list[int]
    beam: int
    max_length: int
    length_penalty: float
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0
    inference_s: float = 0.0  # compute time of the batch the item ran in
    batch_no: int = -1


class TranslationModel:
    kind = "translation"

    def __init__(self, manifest: Manifest, encoder, decoder, tokenizer: Tokenizer, settings: Settings,
                 runtime: Runtime, variant: str, io_binding: bool | None = None):
        self.name, self.manifest, self.variant = manifest.name, manifest, variant
        self.encoder, self.decoder, self.tokenizer = encoder, decoder, tokenizer
        self.settings, self.runtime = settings, runtime
        self.provider = decoder.get_providers()[0]
        self.io = GraphIO.inspect(decoder, manifest.architecture)
        special = manifest.special_tokens
        self.pad_id, self.eos_id = int(special.get("pad", 0)), int(special["eos"])
        self.start_id = int(special.get("decoder_start", special.get("bos", 0)))
        positions = int(manifest.architecture.get("max_positions") or 0) or None
        self.max_length = min(int(manifest.max_output_tokens or positions or 256), (positions or 1 << 30) - 1)
        if io_binding is None:
            io_binding = self.provider == "CUDAExecutionProvider"
        self.device = ("cuda" if self.provider == "CUDAExecutionProvider" else "cpu") if io_binding else None
        self._queue: list[_Item] = []
        self._running: list[_Item] = []  # the batch being decoded
        self._batches = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        metrics.QUEUE_CAPACITY.labels(self.name).set(MAX_QUEUED_SOURCES)

    @classmethod
    def load(cls, model_dir: ModelDir, settings: Settings, runtime: Runtime) -> "TranslationModel":
        m = model_dir.manifest
        variant = runtime.choose_variant(m, "decoder")
        enc_variant = variant if variant in m.variants("encoder") else "fp32"
        encoder = runtime.create_session(model_dir.file(m.graph("encoder", enc_variant).file))
        decoder = runtime.create_session(model_dir.file(m.graph("decoder", variant).file))
        tokenizer = Tokenizer.from_file(str(model_dir.file(m.tokenizer["file"])))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return cls(m, encoder, decoder, tokenizer, settings, runtime, variant)

    async def translate(self, inputs: list[str], options: TranslateOptions) -> TranslateResult:
        """Translates every input (batched with concurrent calls); raises InvalidArgument and friends."""
        start = time.perf_counter()
        max_length = self._check(inputs, options)
        encoded = [self.tokenizer.encode(text).ids for text in inputs]
        for i, ids in enumerate(encoded):
            if len(ids) > self.manifest.max_input_tokens:
                raise InvalidArgument(f"inputs[{i}] is {len(ids)} tokens; model {self.name!r} accepts at most "
                                      f"{self.manifest.max_input_tokens} (split the sentence)")
        tokenize_s = time.perf_counter() - start
        loop = asyncio.get_running_loop()
        items = [_Item(ids, options.beam_size, max_length, options.length_penalty, loop.create_future()) for ids in encoded]
        self._enqueue(items)
        try:
            outputs = await asyncio.gather(*(it.future for it in items))
        finally:
            for it in items:
                it.future.cancel()  # a no-op when done; frees queued items of an abandoned call
        metrics.TOKENS.labels(self.name, "input").inc(sum(map(len, encoded)))
        out_tokens = sum(len(h.tokens) for h in outputs)
        metrics.TOKENS.labels(self.name, "output").inc(out_tokens)
        timings = Timings(tokenize_ms=tokenize_s * 1e3, queue_ms=max(it.queue_s for it in items) * 1e3,
                          inference_ms=sum({it.batch_no: it.inference_s for it in items}.values()) * 1e3,
                          total_ms=(time.perf_counter() - start) * 1e3)
        texts = [Translation(self.tokenizer.decode(h.tokens, skip_special_tokens=True), h.score, h.tokens)
                 for h in outputs]
        return TranslateResult(texts, sum(map(len, encoded)), out_tokens, timings)

    def _check(self, inputs: list[str], options: TranslateOptions) -> int:
        if not inputs:
            raise InvalidArgument("inputs is empty; send at least one sentence to translate")
        if len(inputs) > MAX_INPUTS:
            raise InvalidArgument(f"{len(inputs)} inputs in one call; the limit is {MAX_INPUTS}: split the call")
        for i, text in enumerate(inputs):
            if not text.strip():
                raise InvalidArgument(f"inputs[{i}] is empty; every input must contain text")
        if not 1 <= options.beam_size <= self.settings.translate_max_beam:
            raise InvalidArgument(f"beam_size must be in [0, {self.settings.translate_max_beam}] "
                                  f"(0 or 1 = greedy), got {options.beam_size}")
        if not np.isfinite(options.length_penalty) or options.length_penalty < 0:
            raise InvalidArgument(f"length_penalty must be finite and >= 0 (0 = default 1.0), got {options.length_penalty}")
        wanted = options.max_length or self.settings.translate_default_max_length or self.max_length
        return min(wanted, self.max_length)

    def _enqueue(self, items: list[_Item]) -> None:
        if self._closing:
            raise Unavailable(f"model {self.name!r} is shutting down; retry on another replica")
        if len(self._queue) + len(items) > MAX_QUEUED_SOURCES:
            raise ResourceExhausted(f"translation queue of model {self.name!r} is full "
                                    f"({len(self._queue)} sources waiting); retry with backoff")
        self._queue.extend(items)
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self._queue))
        self._wake.set()

    def _next_batch(self) -> list[_Item]:
        """Live items of the head's beam size, in arrival order, up to translate_max_batch rows."""
        self._queue = [it for it in self._queue if not it.future.done()]
        if not self._queue:
            return []
        beam = self._queue[0].beam
        room = max(self.settings.translate_max_batch // beam, 1)
        batch = [it for it in self._queue if it.beam == beam][:room]
        chosen = {id(it) for it in batch}
        self._queue = [it for it in self._queue if id(it) not in chosen]
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self._queue))
        return batch

    async def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if not batch:
                self._wake.clear()
                await self._wake.wait()
                continue
            now, self._batches, self._running = time.perf_counter(), self._batches + 1, batch
            for it in batch:
                it.queue_s, it.batch_no = now - it.arrived, self._batches
                metrics.QUEUE_DURATION.labels(self.name).observe(it.queue_s)
            try:
                results = await self.runtime.run(self._decode_batch, batch)
            except Exception as exc:  # noqa: BLE001 - one bad batch must not kill the model's loop
                log.exception("translation batch failed for model %s", self.name)
                results = [exc] * len(batch)
            self._running = []
            for it, res in zip(batch, results):
                if not it.future.done():
                    (it.future.set_exception if isinstance(res, BaseException) else it.future.set_result)(res)

    def _decode_batch(self, batch: list[_Item]) -> list:
        """Compute thread: encoder once for the batch, then greedy or beam search."""
        t0 = time.perf_counter()
        longest = max(len(it.ids) for it in batch)
        ids = np.full((len(batch), longest), self.pad_id, np.int64)  # (n, S)
        mask = np.zeros((len(batch), longest), np.int64)  # (n, S)
        for i, it in enumerate(batch):
            ids[i, : len(it.ids)], mask[i, : len(it.ids)] = it.ids, 1
        cross = self.encoder.run(None, {"input_ids": ids, "attention_mask": mask})  # each (n, H, S, D)
        beam = batch[0].beam
        rows = np.repeat(np.arange(len(batch)), beam)  # each source's rows k times, contiguously
        state = Seq2SeqState(self.decoder, self.io, [c[rows] for c in cross], mask[rows], self.device)
        lengths, lp = [it.max_length for it in batch], batch[0].length_penalty
        if beam == 1:
            hyps = greedy_search(state, self.start_id, self.eos_id, lengths, lp)
        else:
            hyps = beam_search(state, beam, self.start_id, self.eos_id, lengths, lp)
        elapsed = time.perf_counter() - t0
        for it in batch:
            it.inference_s = elapsed
        metrics.INFERENCE_DURATION.labels(self.name).observe(elapsed)
        metrics.BATCH_SIZE.labels(self.name).observe(len(batch) * beam)
        metrics.BATCH_TOKENS.labels(self.name).observe(ids.size)
        return hyps

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"translation-{self.name}")

    async def warmup(self) -> None:
        await self.translate(["Hello."], TranslateOptions(max_length=2))

    async def stop(self) -> None:
        """Refuses new calls, finishes queued ones within the grace period, then stops the task."""
        self._closing = True
        deadline = time.monotonic() + self.settings.grace_seconds
        while any(not it.future.done() for it in self._queue + self._running) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for it in self._queue + self._running:
            if not it.future.done():
                it.future.set_exception(Unavailable(f"model {self.name!r} shut down before the call was served"))
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def info(self) -> dict[str, Any]:
        info = model_info(self, self.io.vocab_size)
        info["max_output_tokens"] = self.max_length
        return info
