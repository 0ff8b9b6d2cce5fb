"""The generation core's query and what it asks beyond one generation: `n` choices, `echo`,
`logprobs` (docs/design/scoring.md). Every door (gRPC, OpenAI's HTTP, KServe) gets them from here.

- `check_query(query)`: the query's own ranges (INVALID_ARGUMENT naming the field), before any queue place.
- `choice_params(query, j)`: the engine's settings of choice j: its own seed stream (seed + j;
  unseeded stays unseeded) and, with echo, the prompt scored once, by choice 0 (the other choices
  share its scores). A score-only query runs choice 0 alone: its choices are all alike.
- `Shaper`: one choice's chunks as a door shows them: with echo the prompt's text before the first
  chunk's and its scores before the generated tokens', every score with its character offset in
  prompt + completion (OpenAI's convention: without echo the first generated token's offset is the
  prompt's length; a special token the text leaves out is zero wide).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from service.errors import InvalidArgument
from service.generation.decoding import SamplingParams
from service.generation.output import Chunk
from service.generation.scoring import TokenLogprobs

MAX_STREAM_INTERVAL_MS = 1000
MAX_N = 16  # choices per prompt
MAX_LOGPROBS = 5  # alternatives per token a query may ask (OpenAI's limit for completions)


@dataclass(frozen=True)
class GenerateQuery:
    prompt: str | list[int]  # text, or token ids taken as they are (no start token added)
    params: SamplingParams  # logprobs: alternatives per token (None: no scores); score_only: echo's prompt alone
    model: str = ""  # empty: the default generation model
    stream_interval_ms: int = 0  # a stream pauses this long after each message (0: none)
    prompt_name: str = "prompt"  # how a refusal names the prompt (a request's prompt[i])
    n: int = 1  # choices, choice j sampled with seed + j
    echo: bool = False  # the prompt's text (and with logprobs its scores) before the generated ones
    stream: bool = False  # the door streams the chunks (one choice only)

    @property
    def runs(self) -> int:
        """Generations to queue: n, or 1 for a score-only query (its choices are alike)."""
        return 1 if self.params.score_only else self.n

    @property
    def shaped(self) -> bool:
        """Whether its chunks need a Shaper (else they go out as the scheduler posts them)."""
        return self.echo or self.params.logprobs is not None


def check_query(query: GenerateQuery) -> None:
    """INVALID_ARGUMENT naming the first field of the query out of its range."""
    if query.stream_interval_ms > MAX_STREAM_INTERVAL_MS:
        raise InvalidArgument(
            f"stream_interval_ms must be at most {MAX_STREAM_INTERVAL_MS} (0 = send tokens as "
            f"soon as they are ready), got {query.stream_interval_ms}"
        )
    if not 1 <= query.n <= MAX_N:
        raise InvalidArgument(f"n must be in [1, {MAX_N}] (choices per prompt), got {query.n}")
    if query.stream and query.n > 1:
        raise InvalidArgument("stream is supported for n=1; ask for the other choices in separate requests")
    top = query.params.logprobs
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise InvalidArgument(f"logprobs must be in [0, {MAX_LOGPROBS}] (alternatives per token), got {top}")
    if query.params.score_only and not query.echo:
        raise InvalidArgument("a request for no new token scores its prompt and needs echo")


def choice_params(query: GenerateQuery, j: int) -> SamplingParams:
    """Choice j's settings for the engine (module doc)."""
    p = query.params
    seed = None if p.seed is None else (p.seed + j) % 2**64
    scored = j == 0 and query.echo and (p.logprobs is not None or p.score_only)
    return dataclasses.replace(p, seed=seed, prompt_logprobs=(p.logprobs or 0) if scored else None)


class Shaper:
    """One choice's chunks in order (or its joined chunk) -> what the doors show (module doc).
    Choices j > 0 of an echo query get choice 0's prompt scores as `prompt_scores`."""

    def __init__(self, prompt_text: str, echo: bool, logprobs: bool):
        self.prompt_text, self.logprobs = prompt_text, logprobs
        self.offset = len(prompt_text)  # the next generated token's text offset
        self._echoed = not echo

    def __call__(self, chunk: Chunk, prompt_scores: TokenLogprobs | None = None) -> Chunk:
        text, scores = chunk.text, TokenLogprobs()
        if not self._echoed:
            self._echoed = True
            text = self.prompt_text + text
            prompt = prompt_scores or chunk.prompt_logprobs
            if self.logprobs and prompt is not None:
                scores.extend(dataclasses.replace(prompt, offsets=_offsets(prompt.widths, 0)))
        if self.logprobs and chunk.logprobs is not None:
            scores.extend(dataclasses.replace(chunk.logprobs, offsets=_offsets(chunk.logprobs.widths, self.offset)))
            self.offset += sum(chunk.logprobs.widths)
        return dataclasses.replace(chunk, text=text, logprobs=scores if self.logprobs else None, prompt_logprobs=None)


def _offsets(widths: list[int], start: int) -> list[int]:
    """Each token's character offset: start, then past the characters of the tokens before it."""
    out, at = [], start
    for width in widths:
        out.append(at)
        at += width
    return out
