"""Pure decoding helpers shared by the generator: sampling settings, stop sequences, incremental
detokenising (the tokens of a step are chosen by sampler.py, for the whole batch at once).

- `SamplingParams` + `check_params`: the knobs of one generation and their allowed ranges
  (violations raise `ParamError`, which the model maps to INVALID_ARGUMENT); `make_rng`, the
  generator of one request.
- `IncrementalDetokenizer`: token ids -> text deltas that never split a UTF-8 character
  (byte-level BPE tokens may end mid-character; the decoder then yields U+FFFD: hold it back),
  following TGI's prefix/read offsets.
- `StopMatcher`: finds stop sequences in text across token boundaries, cuts them, and holds back
  any tail that could still become the start of a stop sequence.
No onnxruntime, no protobuf: numpy and a `tokenizers.Tokenizer` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.generation.scoring import MAX_TOP

REPLACEMENT_CHAR = "\ufffd"
MAX_CONTINUATION_TOKENS = 3  # a UTF-8 character has at most 3 bytes after its first
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
# Sampled scores are logits / penalty / temperature: below these a float32 logit divided by them
# overflows to inf, and inf - inf makes the probabilities NaN (garbage tokens, no error). Hence a
# stated range, as for length_penalty, rather than a silent clamp.
SCALE_RANGE = (1e-3, 1e3)


class ParamError(ValueError):
    """A sampling / generation parameter out of its allowed range; the message says which and why."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 0  # 0: the server default
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 0.0  # 0 or 1: off
    repetition_penalty: float = 0.0  # 0: off; 1: neutral
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    logprobs: int | None = None  # each generated token's log-probability and this many alternatives; None: off
    prompt_logprobs: int | None = None  # the same for every prompt token (teacher-forced); None: off
    score_only: bool = False  # no new token: the prompt's scores alone (with prompt_logprobs)
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2] (service/generation/penalties.py)
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    min_p: float = 0.0  # 0: off
    constraint: Any = field(default=None, compare=False)  # structured output: constraint.Compiled, or None
    speculative: bool | None = None  # prompt-lookup speculation (speculate.py); None: the server's gen_speculate

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_params(p: SamplingParams) -> None:
    """Raises ParamError naming the first parameter out of range and the allowed range."""
    lo, hi = SCALE_RANGE
    if not (p.temperature == 0 or lo <= p.temperature <= hi):
        raise ParamError(f"temperature must be 0 (greedy) or in [{lo:g}, {hi:g}], got {p.temperature}")
    if p.top_k < 0:
        raise ParamError(f"top_k must be >= 0 (0 = off), got {p.top_k}")
    if not math.isfinite(p.top_p) or not 0.0 <= p.top_p <= 1.0:
        raise ParamError(f"top_p must be in [0, 1] (0 or 1 = off), got {p.top_p}")
    if not (p.repetition_penalty == 0 or lo <= p.repetition_penalty <= hi):
        raise ParamError(
            f"repetition_penalty must be 0 (off) or in [{lo:g}, {hi:g}] (1 = neutral), got {p.repetition_penalty}"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if not (math.isfinite(value) and -2.0 <= value <= 2.0):
            raise ParamError(f"{name} must be in [-2, 2] (0 = off), got {value}")
    if not (math.isfinite(p.min_p) and 0.0 <= p.min_p <= 1.0):
        raise ParamError(f"min_p must be in [0, 1] (0 = off), got {p.min_p}")
    for token, bias in p.logit_bias:
        if token < 0 or not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
            raise ParamError(f"logit_bias[{token}]={bias}: token ids are >= 0 and biases in [-100, 100]")
    if p.max_new_tokens < 0:
        raise ParamError(f"max_new_tokens must be >= 0 (0 = server default), got {p.max_new_tokens}")
    for name in ("logprobs", "prompt_logprobs"):
        top = getattr(p, name)
        if top is not None and not 0 <= top <= MAX_TOP:
            raise ParamError(f"{name} must be in [0, {MAX_TOP}] (alternatives per token), got {top}")
    if p.score_only and p.prompt_logprobs is None:
        raise ParamError("score_only needs prompt_logprobs: without new tokens the prompt's scores are the result")
    if len(p.stop) > MAX_STOP_SEQUENCES:
        raise ParamError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(p.stop)}")
    for i, s in enumerate(p.stop):
        if not s:
            raise ParamError(f"stop[{i}] is empty; stop sequences must be non-empty strings")
        if len(s) > MAX_STOP_CHARS:
            raise ParamError(f"stop[{i}] is {len(s)} characters; the limit is {MAX_STOP_CHARS}")


def make_rng(seed: int | None) -> np.random.Generator:
    """One generator per request, so a seed reproduces the output whatever else runs."""
    return np.random.default_rng(seed)


class IncrementalDetokenizer:
    """Token ids in, text deltas out; never emits a partial UTF-8 character until the end.

    The prompt's last few tokens are decoded along with the new ones so that decoders that
    depend on the left context (e.g. a Metaspace leading space) produce the right text. That
    window starts at a character: byte-fallback decoders (Llama's `<0xE2>` tokens) turn a whole
    run of byte tokens into U+FFFD when it begins inside a character, so a window starting in the
    middle of the prompt's last emoji would hide every byte token generated after it.
    """

    def __init__(self, tokenizer, prompt_ids: list[int], context: int = 5):
        self._tok = tokenizer
        self._ids = list(prompt_ids)
        self._read = len(self._ids)
        self._prefix: int | None = None  # set at the first token (the compute thread's work, not the caller's)
        self._context = context

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def _window_start(self) -> int:
        """The prompt's last `context` tokens, stepping back while their text starts inside a character."""
        start = max(self._read - self._context, 0)
        for _ in range(MAX_CONTINUATION_TOKENS):  # each step back adds a byte or more
            if start == 0 or not self._decode(self._ids[start : self._read]).startswith(REPLACEMENT_CHAR):
                break
            start -= 1
        return start

    def _delta(self) -> str:
        """The text of the tokens past the read offset, in the context of the window before it."""
        if self._prefix is None:
            self._prefix = self._window_start()
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full = self._decode(self._ids[self._prefix :])
        if full.startswith(prefix_text):
            return full[len(prefix_text) :]
        # A new byte token made the window's byte run invalid and the byte-fallback decoder now
        # shows all of it as U+FFFD; the window's text was sent already, so decode the new tokens alone.
        return self._decode(self._ids[self._read :])

    def push(self, token: int) -> str:
        """Adds one token; returns the text it completes (may be empty while a character is split)."""
        self._ids.append(token)
        delta = self._delta()
        if delta and not delta.endswith(REPLACEMENT_CHAR):
            self._prefix, self._read = self._read, len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character shows as U+FFFD)."""
        delta = self._delta()
        self._prefix = self._read = len(self._ids)
        return delta


class StopMatcher:
    """Accumulates generated text; releases only text that cannot be part of a stop sequence."""

    def __init__(self, stops: tuple[str, ...]):
        self._stops = tuple(s for s in stops if s)
        self._pending = ""  # decoded, not yet released
        self.stopped = False

    def push(self, text: str) -> str:
        """Adds decoded text; returns the part safe to release. Sets `stopped` on a match (cut)."""
        if self.stopped:
            return ""
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self._pending, self.stopped = self._pending[:cut], "", True
            return out
        hold = self._held_tail()
        out = self._pending[: len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold :]
        return out

    def _held_tail(self) -> int:
        """Length of the longest suffix of pending text that is a proper prefix of a stop sequence."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best

    def flush(self) -> str:
        """At the end of a generation without a match, the held-back tail is ordinary text."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out
