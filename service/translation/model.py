"""`TranslationModel`: the registry backend for kind "translation" (encoder-decoder, greedy / beam).

`translate(inputs, options, deadline)` checks what needs the model (characters per input before
tokenizing, beam size, length penalty, tokens per input), takes the call's queue places before any
work (service/admission.py), tokenizes and queues one item per source with its own options; the
Seq2SeqScheduler batches the sources of all calls continuously. The list rules (empty, at most
`translate_max_inputs`) are the core's (core.py). A source whose search or detokenisation fails
fails its own call, never its neighbours. Limits are documented in docs/api.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from service import metrics, tokenizing
from service.engine.graphio import GraphIO, attention_off_device
from service.errors import DeadlineExceeded, InvalidArgument, ServiceError
from service.manifest import PACKED_ROLE, Manifest, ModelDir
from service.registry import model_info
from service.runtime import Runtime
from service.settings import Settings
from service.timings import Timings
from service.translation import encoder as source_encoder
from service.translation.scheduler import Item, Seq2SeqScheduler
from service.translation.search import MAX_LENGTH_PENALTY, Hypothesis, SourceSearch

log = logging.getLogger(__name__)


class RowFailed(ServiceError):
    """One input of a call could not be translated (an engine failure on that input alone)."""


@dataclass(frozen=True)
class TranslateOptions:
    """A translation's search options. 0 (a proto field left unset, from any door) means the default,
    resolved here once: beam_size 0 -> 1 (greedy), length_penalty 0 -> 1.0; max_length 0 stays 0
    (settings translate_default_max_length, else the model's, chosen per model)."""

    beam_size: int = 1
    max_length: int = 0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.beam_size == 0:
            object.__setattr__(self, "beam_size", 1)
        if self.length_penalty == 0:
            object.__setattr__(self, "length_penalty", 1.0)


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


class TranslationModel:
    kind = "translation"

    def __init__(
        self,
        manifest: Manifest,
        encoder,
        decoder,
        tokenizer: Tokenizer,
        settings: Settings,
        runtime: Runtime,
        variant: str,
        io_binding: bool | None = None,
    ):
        self.name, self.manifest, self.variant = manifest.name, manifest, variant
        self.encoder, self.decoder, self.tokenizer = encoder, decoder, tokenizer
        self.settings, self.runtime = settings, runtime
        self.provider = decoder.get_providers()[0]
        self.text_encoder = tokenizing.Encoder(tokenizer)
        self.max_input_chars = tokenizing.max_chars(manifest.max_input_tokens, tokenizing.chars_per_token(tokenizer))
        self.io = GraphIO.inspect(decoder, manifest.architecture)
        special = manifest.special_tokens
        self.pad_id, self.eos_id = int(special.get("pad", 0)), int(special["eos"])
        self.start_id = int(special.get("decoder_start", special.get("bos", 0)))
        positions = int(manifest.architecture.get("max_positions") or 0) or None
        self.max_length = min(int(manifest.max_output_tokens or positions or 256), (positions or 1 << 30) - 1)
        self.max_positions = positions or self.max_length + 1  # the most a row caches
        if not self.io.buffer_kv:
            raise ValueError(
                f"model {self.name!r}: its decoder graph has no seqlens_k input (a format-2 model directory, "
                "whose decoder attends over a masked, right-aligned cache); rebuild it with `make models` or "
                "`python -m export convert`"
            )
        if io_binding is None:
            io_binding = self.provider == "CUDAExecutionProvider"
        if io_binding and (cpu_attention := attention_off_device(self.provider, self.io)):
            log.warning("translation model %s: served without IO binding: %s", self.name, cpu_attention)
            io_binding = False
        self.device = ("cuda" if self.provider == "CUDAExecutionProvider" else "cpu") if io_binding else None
        self.execution = "packed" if source_encoder.is_packed(encoder) else "padded"
        self.scheduler = Seq2SeqScheduler(
            self.name,
            encoder,
            decoder,
            self.io,
            runtime,
            max_rows=settings.translate_max_batch,
            max_queue=settings.translate_max_queue,
            pad_id=self.pad_id,
            device=self.device,
            max_positions=self.max_positions,
            gate=runtime.gate,
            pack_row_tokens=settings.embed_pack_row_tokens if self.execution == "packed" else None,
            pack_align=source_encoder.alignment(variant),
        )
        self._task: asyncio.Task | None = None

    @classmethod
    def load(cls, model_dir: ModelDir, settings: Settings, runtime: Runtime) -> TranslationModel:
        m = model_dir.manifest
        variant = runtime.choose_variant(m, "decoder")
        role, enc_variant = source_encoder.encoder_graph(m, variant, settings.embed_pack_row_tokens)
        encoder = runtime.create_session(model_dir.file(m.graph(role, enc_variant).file))
        log.info(
            "translation model %s: %s decoder, %s %s encoder",
            m.name,
            variant,
            enc_variant,
            "packed" if role == PACKED_ROLE else "padded",
        )
        decoder = runtime.create_session(model_dir.file(m.graph("decoder", variant).file))
        tokenizer = tokenizing.load(model_dir.file(m.tokenizer["file"]))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return cls(m, encoder, decoder, tokenizer, settings, runtime, variant)

    async def translate(
        self, inputs: list[str], options: TranslateOptions, deadline: float | None = None
    ) -> TranslateResult:
        """Translates every input (batched with concurrent calls); `deadline`: time.monotonic() after which
        queued sources are dropped and the call fails with DeadlineExceeded. Raises InvalidArgument and friends."""
        start = time.perf_counter()
        max_length = self._check(inputs, options)
        self.scheduler.admission.take(len(inputs))  # before any work on the call
        try:
            encoded = await self._tokenize(inputs)
        except BaseException:
            self.scheduler.admission.release(len(inputs))
            raise
        tokenize_s = time.perf_counter() - start
        loop = asyncio.get_running_loop()
        items = [
            Item(
                ids,
                SourceSearch(options.beam_size, self.start_id, self.eos_id, max_length, options.length_penalty),
                loop.create_future(),
                deadline=deadline,
            )
            for ids in encoded
        ]
        self.scheduler.submit(items)
        try:
            async with asyncio.timeout(None if deadline is None else deadline - time.monotonic()):
                outputs = await asyncio.gather(*(it.future for it in items))
        except TimeoutError as exc:
            raise DeadlineExceeded(
                "the call's deadline passed before its translations finished; allow more time or split the call"
            ) from exc
        except Exception as exc:
            raise self._failure(items, exc) from exc
        finally:
            if any(not it.future.done() for it in items):
                for it in items:
                    it.future.cancel()  # frees queued and running sources of an abandoned call
                self.scheduler.poke()
        texts = self._detokenize(outputs)
        out_tokens = sum(len(h.tokens) for h in outputs)
        metrics.TOKENS.labels(self.name, "output").inc(out_tokens)
        timings = Timings.of_seconds(
            time.perf_counter() - start,
            tokenize_s,
            max(it.queue_s for it in items),
            max(it.inference_s for it in items),
        )
        return TranslateResult(texts, sum(map(len, encoded)), out_tokens, timings)

    async def _tokenize(self, inputs: list[str]) -> list[list[int]]:
        """Token ids per input; a large call tokenizes in a thread so the event loop stays free."""
        encoded = [e.ids for e in await self.text_encoder.encode(inputs)]
        for i, ids in enumerate(encoded):
            if len(ids) > self.manifest.max_input_tokens:
                raise InvalidArgument(
                    f"inputs[{i}] is {len(ids)} tokens; model {self.name!r} accepts at most "
                    f"{self.manifest.max_input_tokens} (split the sentence)"
                )
        return encoded

    def _detokenize(self, outputs: list[Hypothesis]) -> list[Translation]:
        texts = []
        for i, h in enumerate(outputs):
            try:
                texts.append(Translation(self.tokenizer.decode(h.tokens, skip_special_tokens=True), h.score, h.tokens))
            except Exception as exc:  # this call's own input: a clear status, not INTERNAL's generic one
                raise self._row_failed(i, exc) from exc
        return texts

    def _failure(self, items: list[Item], exc: BaseException) -> BaseException:
        """The error a call gets when one of its sources failed in the engine."""
        if isinstance(exc, ServiceError):
            return exc
        failed = next(
            (
                i
                for i, it in enumerate(items)
                if it.future.done() and not it.future.cancelled() and it.future.exception() is exc
            ),
            0,
        )
        return self._row_failed(failed, exc)

    def _row_failed(self, index: int, exc: BaseException) -> RowFailed:
        log.error("model %s could not translate inputs[%d]", self.name, index, exc_info=exc)
        return RowFailed(
            f"model {self.name!r} failed to translate inputs[{index}] ({type(exc).__name__}; logged on "
            f"the server); the other calls in its batch were not affected"
        )

    def _check(self, inputs: list[str], options: TranslateOptions) -> int:
        for i, text in enumerate(inputs):
            tokenizing.check_chars(
                text,
                self.max_input_chars,
                f"inputs[{i}]",
                self.name,
                self.manifest.max_input_tokens,
                "split the sentence",
            )
        if not 1 <= options.beam_size <= self.settings.translate_max_beam:
            raise InvalidArgument(
                f"beam_size must be in [0, {self.settings.translate_max_beam}] "
                f"(0 or 1 = greedy), got {options.beam_size}"
            )
        if not (np.isfinite(options.length_penalty) and 0 <= options.length_penalty <= MAX_LENGTH_PENALTY):
            raise InvalidArgument(
                f"length_penalty must be in [0, {MAX_LENGTH_PENALTY:g}] (0 = default 1.0), got {options.length_penalty}"
            )
        wanted = options.max_length or self.settings.translate_default_max_length or self.max_length
        return min(wanted, self.max_length)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.scheduler.run(), name=f"translation-{self.name}")

    async def warmup(self) -> None:
        await self.translate(["Hello."], TranslateOptions(max_length=2))

    async def stop(self) -> None:
        """Refuses new calls, finishes queued ones within the grace period, then stops the task."""
        await self.scheduler.stop(self.settings.grace_seconds)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def info(self) -> dict[str, Any]:
        info = model_info(self, self.io.vocab_size)
        info["max_output_tokens"] = self.max_length
        info["manifest"]["serving.execution"] = self.execution
        return info
