"""One generation request as the scheduler holds it: a row's state (its tokens, sampler settings,
where it is in its life) and the two parts other owners work on: its `output` (output.py, the
text work the compute thread does after each step) and its `outbox` (handle.py, the chunks its
caller takes on the event loop).

`Sequence.accept(token)` runs in the compute thread right after the logits of a step: it records
the token (and feeds the repetition penalty), lets the output processing make the chunk, and
stamps the last chunk's usage and timings; the scheduler posts chunks to the outbox on the loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from service.errors import InvalidArgument
from service.generation.constraint import RowConstraint
from service.generation.decoding import SamplingParams, make_rng
from service.generation.handle import Outbox
from service.generation.output import Chunk, Output
from service.generation.sampler import Row
from service.generation.scoring import TokenLogprobs
from service.timings import Timings

if TYPE_CHECKING:
    from service.generation.speculate import Lookup


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams  # max_new_tokens already resolved and capped
    eos_ids: frozenset[int]  # generation ends (EOS) at any of them
    tokenizer: Any  # tokenizers.Tokenizer
    arrived: float = field(default_factory=time.perf_counter)
    timings: Timings = field(default_factory=Timings)
    generated: list[int] = field(default_factory=list)
    outbox: Outbox = field(default_factory=Outbox)  # the caller's side (event loop)
    cancelled: bool = False
    started: float | None = None  # when its prefill began
    last_token_at: float | None = None
    left: bool = False  # its cache row is freed (set by the compute thread)
    counted_out: bool = False  # the in-flight gauge was decremented for it (event loop)
    retried: bool = False  # it was re-prefilled once after a failed step (scheduler)
    cached_tokens: int = 0  # prompt tokens its prefill took from the prefix cache (prefix.py)
    drafts: tuple[int, int, int] = (0, 0, 0)  # speculation (speculate.py): passes, tokens kept, steps paused
    lookup: Lookup | None = None  # speculation: its tokens' n-grams (speculate.py), made at its first draft

    def __post_init__(self) -> None:
        self._penalised = self.params.repetition_penalty not in (0.0, 1.0)
        seen = np.asarray(self.prompt_ids if self._penalised else [], dtype=np.int64)
        # What the sampler reads; greedy rows draw nothing (an unseeded generator costs an OS entropy read).
        self.sampling = Row(self.params, seen, None if self.params.greedy else make_rng(self.params.seed))
        if self.params.constraint is not None:
            self.sampling.constraint = RowConstraint(self.params.constraint)
        self.output = Output(self.tokenizer, self.prompt_ids, self.params, self.eos_ids)

    @property
    def finished(self) -> str | None:
        """Its finish reason once its output ended (EOS, a stop sequence, its length)."""
        return self.output.finished

    @property
    def length(self) -> int:
        """Tokens in the cache once the last generated token is fed back."""
        return len(self.prompt_ids) + len(self.generated)

    @property
    def done(self) -> bool:
        return self.output.finished is not None or self.cancelled

    @property
    def cache_ids(self) -> list[int]:
        """The tokens its cache row holds once the last generated token is fed back (a re-prefill)."""
        return self.prompt_ids + self.generated

    def score_prompt(self, logits: np.ndarray) -> None:
        """Compute thread: the prompt's scores from its prefill logits (T, V)."""
        self.output.score_prompt(logits)

    def scored(self) -> Chunk:
        """Compute thread: the only chunk of a score-only request, finished."""
        chunk = self.output.scored()
        self._finish(chunk)
        return chunk

    def accept(self, token: int, scores: TokenLogprobs | None = None) -> Chunk | None:
        """Compute thread: records a generated token; returns the chunk to send, if any."""
        self.generated.append(token)
        if self._penalised:
            self.sampling.seen = np.append(self.sampling.seen, token)
        if self.params.presence_penalty or self.params.frequency_penalty:
            self.sampling.counts[token] = self.sampling.counts.get(token, 0) + 1
        complete = self.sampling.constraint is not None and self.sampling.constraint.accept(token)
        chunk = self.output.accept(token, scores, len(self.generated), complete)
        if chunk is not None and self.output.finished is not None:
            self._finish(chunk)
        return chunk

    def sampling_failed(self, exc: Exception) -> InvalidArgument:
        """The error of a row whose sampling raised: its settings are all that sampling depends on."""
        p = self.params
        return InvalidArgument(
            f"sampling token {len(self.generated) + 1} failed with this request's settings "
            f"(temperature={p.temperature}, top_k={p.top_k}, top_p={p.top_p}, "
            f"repetition_penalty={p.repetition_penalty}): {type(exc).__name__}; try other values"
        )

    def _finish(self, chunk: Chunk) -> None:
        """The last chunk's finish reason, usage and timings."""
        self.timings.total_ms = (time.perf_counter() - self.arrived) * 1e3
        chunk.finish_reason = self.output.finished
        chunk.input_tokens, chunk.output_tokens = len(self.prompt_ids), len(self.generated)
        chunk.cached_tokens = min(self.cached_tokens, len(self.prompt_ids))
        chunk.timings = self.timings
