"""One generation request as the scheduler sees it: its tokens, sampler, text state and chunks.

`Sequence.accept(token)` runs in the compute thread right after the logits of a step: it appends
the token, decodes the new text (UTF-8 safe), applies stop sequences and EOS / length limits, and
returns the `Chunk` to send (or None while text is held back). The scheduler `post`s chunks on
the event loop into the sequence's outbox, a plain list; `GenerationHandle` is the caller's side.
The hand-off costs one list append per chunk and at most one wake-up of the caller per decode
step: the caller's future is resolved only when it is waiting, and a caller that reads the whole
generation (unary Generate) is woken once, when it ends.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import InvalidArgument
from service.generation.constraint import RowConstraint
from service.generation.decoding import IncrementalDetokenizer, SamplingParams, StopMatcher, make_rng
from service.generation.sampler import Row
from service.generation.scoring import TokenLogprobs, prompt_scores
from service.timings import Timings

LENGTH, STOP, EOS = "length", "stop", "eos"  # finish reasons


@dataclass
class Chunk:
    """New text and the tokens behind it; the last chunk has finish_reason, usage and timings."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    timings: Timings | None = None
    logprobs: TokenLogprobs | None = None  # of token_ids, when the request asked (params.logprobs)
    prompt_logprobs: TokenLogprobs | None = None  # the prompt's, on the first chunk (params.prompt_logprobs)

    def ending(self) -> tuple[str, Timings]:
        """The last chunk's finish reason and timings (Sequence._finish sets both together)."""
        if self.finish_reason is None or self.timings is None:
            raise RuntimeError("a generation's last chunk lacks its finish reason or timings")
        return self.finish_reason, self.timings


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams  # max_new_tokens already resolved and capped
    eos_ids: frozenset[int]  # generation ends (EOS) at any of them
    tokenizer: Any  # tokenizers.Tokenizer
    arrived: float = field(default_factory=time.perf_counter)
    timings: Timings = field(default_factory=Timings)
    generated: list[int] = field(default_factory=list)
    outbox: list = field(default_factory=list)  # chunks and at most one error, not yet taken (event loop)
    waiter: asyncio.Future | None = None  # the caller's, while it waits for the outbox
    wake_at_end: bool = False  # the caller waits for the whole generation: wake it only at its end
    cancelled: bool = False
    finished: str | None = None
    started: float | None = None  # when its prefill began
    last_token_at: float | None = None
    left: bool = False  # its cache row is freed (set by the compute thread)
    counted_out: bool = False  # the in-flight gauge was decremented for it (event loop)
    retried: bool = False  # it was re-prefilled once after a failed step (scheduler)
    prompt_scores: TokenLogprobs | None = None  # computed at its prefill when params.prompt_logprobs asks

    def __post_init__(self) -> None:
        self._penalised = self.params.repetition_penalty not in (0.0, 1.0)
        seen = np.asarray(self.prompt_ids if self._penalised else [], dtype=np.int64)
        # What the sampler reads; greedy rows draw nothing (an unseeded generator costs an OS entropy read).
        self.sampling = Row(self.params, seen, None if self.params.greedy else make_rng(self.params.seed))
        if self.params.constraint is not None:
            self.sampling.constraint = RowConstraint(self.params.constraint)
        self.detok = IncrementalDetokenizer(self.tokenizer, self.prompt_ids)
        self.stops = StopMatcher(self.params.stop) if self.params.stop else None
        self._unsent: list[int] = []
        self._unsent_scores = TokenLogprobs() if self.params.logprobs is not None else None
        self._prompt_sent = False

    def post(self, item: Chunk | BaseException) -> None:
        """Event loop: a chunk (or the call's error) for the caller; wakes it if it waits."""
        self.outbox.append(item)
        waiter = self.waiter
        wake = not self.wake_at_end or isinstance(item, BaseException) or item.finish_reason is not None
        if waiter is not None and not waiter.done() and wake:
            waiter.set_result(None)

    @property
    def length(self) -> int:
        """Tokens in the cache once the last generated token is fed back."""
        return len(self.prompt_ids) + len(self.generated)

    @property
    def done(self) -> bool:
        return self.finished is not None or self.cancelled

    @property
    def cache_ids(self) -> list[int]:
        """The tokens its cache row holds once the last generated token is fed back (a re-prefill)."""
        return self.prompt_ids + self.generated

    def score_prompt(self, logits: np.ndarray) -> None:
        """Compute thread: the prompt's scores from its prefill logits (T, V), once (not again at a retry)."""
        if self.prompt_scores is None:
            scores = prompt_scores(logits, self.prompt_ids, self.params.prompt_logprobs or 0)
            detok = IncrementalDetokenizer(self.tokenizer, [])  # the prompt's text from its start
            scores.widths = [len(detok.push(t)) for t in self.prompt_ids]
            self.prompt_scores = self._spelled(scores)

    def scored(self) -> Chunk:
        """The only chunk of a score-only request (no new token): empty, finished, with the prompt's scores."""
        self.finished = LENGTH
        chunk = self._with_scores(Chunk("", []))
        self._finish(chunk)
        return chunk

    def _with_scores(self, chunk: Chunk) -> Chunk:
        if self._unsent_scores is not None:
            chunk.logprobs = self._spelled(self._unsent_scores.take())
        if self.prompt_scores is not None and not self._prompt_sent:
            chunk.prompt_logprobs, self._prompt_sent = self.prompt_scores, True
        return chunk

    def _spelled(self, scores: TokenLogprobs) -> TokenLogprobs:
        """scores with each token's and alternative's text, special tokens spelled out (as OpenAI
        shows a token), from one batch decode."""
        ids = sorted({*scores.token_ids, *(t for row in scores.top_ids for t in row)})
        names = dict(zip(ids, self.tokenizer.decode_batch([[t] for t in ids], skip_special_tokens=False), strict=True))
        scores.tokens = [names[t] for t in scores.token_ids]
        scores.top_tokens = [[names[t] for t in row] for row in scores.top_ids]
        return scores

    def accept(self, token: int, scores: TokenLogprobs | None = None) -> Chunk | None:
        """Records a generated token; returns the chunk to send, if any. Text work is skipped where
        it cannot change anything: no detokenising of EOS, no stop matching without stop sequences."""
        self.generated.append(token)
        self._unsent.append(token)
        if self._penalised:
            self.sampling.seen = np.append(self.sampling.seen, token)
        text = decoded = ""
        if token in self.eos_ids:
            self.finished = EOS
        else:
            decoded = self.detok.push(token)
            text = self._released(decoded)
            if self.finished is None and len(self.generated) >= self.params.max_new_tokens:
                self.finished = LENGTH
        if self.params.presence_penalty or self.params.frequency_penalty:
            self.sampling.counts[token] = self.sampling.counts.get(token, 0) + 1
        done = self.sampling.constraint is not None and self.sampling.constraint.accept(token)
        if done and self.finished in (None, LENGTH):  # the grammar is complete: a natural end
            self.finished = EOS
        if self._unsent_scores is not None and scores is not None:
            scores.widths = [len(decoded)]  # the token's own text, before stop sequences cut it
            self._unsent_scores.extend(scores)
        if self.finished is not None and self.finished != STOP:
            text += self._released(self.detok.flush())
            if self.stops is not None and not self.stops.stopped:
                text += self.stops.flush()
        if self.finished is None and not text:
            return None
        chunk = self._with_scores(Chunk(text, self._unsent))
        self._unsent = []
        if self.finished is not None:
            self._finish(chunk)
        return chunk

    def _released(self, text: str) -> str:
        """Decoded text -> the part that may be sent; sets finished = STOP on a stop sequence."""
        if self.stops is None or not text:
            return text
        out = self.stops.push(text)
        if self.stops.stopped:
            self.finished = STOP
        return out

    def sampling_failed(self, exc: Exception) -> InvalidArgument:
        """The error of a row whose sampling raised: its settings are all that sampling depends on."""
        p = self.params
        return InvalidArgument(
            f"sampling token {len(self.generated) + 1} failed with this request's settings "
            f"(temperature={p.temperature}, top_k={p.top_k}, top_p={p.top_p}, "
            f"repetition_penalty={p.repetition_penalty}): {type(exc).__name__}; try other values"
        )

    def _finish(self, chunk: Chunk) -> None:
        now = time.perf_counter()
        self.timings.total_ms = (now - self.arrived) * 1e3
        chunk.finish_reason = self.finished
        chunk.input_tokens, chunk.output_tokens = len(self.prompt_ids), len(self.generated)
        chunk.timings = self.timings


class GenerationHandle:
    """The caller's side: iterate the chunks; `cancel()` (idempotent) frees the row within one step.

    `__anext__` returns the next chunk, waiting when none is there; `ready()` takes those already
    posted; `collect()` waits for the whole generation. An error is raised once the chunks posted
    before it were taken."""

    def __init__(self, seq: Sequence, wake: asyncio.Event):
        self._seq, self._wake = seq, wake
        self._ended = False
        self._taken = 0  # outbox items already returned

    def __aiter__(self) -> GenerationHandle:
        return self

    @property
    def sequence(self) -> Sequence:
        return self._seq

    async def __anext__(self) -> Chunk:
        if self._ended:
            raise StopAsyncIteration
        seq = self._seq
        if self._taken == len(seq.outbox):
            await self._wait()
        item = seq.outbox[self._taken]
        self._taken += 1
        self._trim()
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        self._ended = item.finish_reason is not None
        return item

    def ready(self) -> list[Chunk]:
        """The chunks already posted, without waiting (up to the last one, or up to an error, which
        the next iteration raises). A stream that fell behind the decoder sends them as one message."""
        out: list[Chunk] = []
        box = self._seq.outbox
        while not self._ended and self._taken < len(box) and not isinstance(box[self._taken], BaseException):
            item = box[self._taken]
            self._taken += 1
            out.append(item)
            self._ended = item.finish_reason is not None
        self._trim()
        return out

    async def collect(self) -> list[Chunk]:
        """Every chunk of the generation, waking once at its end (not at every step); raises its error."""
        self._seq.wake_at_end = True
        chunks: list[Chunk] = []
        async for chunk in self:
            chunks.append(chunk)
            chunks.extend(self.ready())
            if chunks and chunks[-1].finish_reason is not None:
                break
        return chunks

    async def _wait(self) -> None:
        seq = self._seq
        seq.waiter = asyncio.get_running_loop().create_future()
        try:
            await seq.waiter
        finally:
            seq.waiter = None

    def _trim(self) -> None:
        if self._taken == len(self._seq.outbox):
            self._seq.outbox.clear()
            self._taken = 0

    def cancel(self) -> None:
        if not self._seq.done:
            self._seq.cancelled = True
            self._wake.set()
