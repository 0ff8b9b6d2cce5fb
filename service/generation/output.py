"""A row's output processing, done in the compute thread right after a step's logits: its tokens
become the `Chunk`s its caller gets.

`Output.accept(token, scores, produced)` decodes the new text (UTF-8 safe), applies stop sequences
and the EOS / length limits (`finished`), and returns the chunk to send, or None while text is held
back; the token's scores get their texts and widths here, where it is detokenized. `score_prompt`
keeps the prompt's scores from its prefill logits for the first chunk; `scored()` is the one
chunk of a score-only row. Text work is skipped where it cannot change anything: no detokenising
of EOS, no stop matching without stop sequences. The row's state (sequence.py) stamps the last
chunk's ending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from service.generation.decoding import IncrementalDetokenizer, SamplingParams, StopMatcher
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
    cached_tokens: int = 0  # of input_tokens, those taken from the prefix cache (prefix.py), not computed

    def ending(self) -> tuple[str, Timings]:
        """The last chunk's finish reason and timings (set together when the row finishes)."""
        if self.finish_reason is None or self.timings is None:
            raise RuntimeError("a generation's last chunk lacks its finish reason or timings")
        return self.finish_reason, self.timings


class Output:
    """One row's text state: its detokenizer, stop matcher, the tokens and scores not yet sent."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int], params: SamplingParams, eos_ids: frozenset[int]):
        self.tokenizer, self.prompt_ids, self.params, self.eos_ids = tokenizer, prompt_ids, params, eos_ids
        self.finished: str | None = None
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.stops = StopMatcher(params.stop) if params.stop else None
        self.prompt_scores: TokenLogprobs | None = None  # computed at its prefill when params.prompt_logprobs asks
        self._unsent: list[int] = []
        self._unsent_scores = TokenLogprobs() if params.logprobs is not None else None
        self._prompt_sent = False

    def score_prompt(self, logits: np.ndarray) -> None:
        """The prompt's scores from its prefill logits (T, V), once (not again at a retry)."""
        if self.prompt_scores is None:
            scores = prompt_scores(logits, self.prompt_ids, self.params.prompt_logprobs or 0)
            detok = IncrementalDetokenizer(self.tokenizer, [])  # the prompt's text from its start
            scores.widths = [len(detok.push(t)) for t in self.prompt_ids]
            self.prompt_scores = self._spelled(scores)

    def scored(self) -> Chunk:
        """The only chunk of a score-only row (no new token): empty, with the prompt's scores."""
        self.finished = LENGTH
        return self._with_scores(Chunk("", []))

    def accept(self, token: int, scores: TokenLogprobs | None, produced: int, complete: bool = False) -> Chunk | None:
        """A generated token (the row's `produced`-th) -> the chunk to send, if any. complete: the
        row's grammar (constraint.py) is complete with it, a natural end (EOS)."""
        self._unsent.append(token)
        text = decoded = ""
        if token in self.eos_ids:
            self.finished = EOS
        else:
            decoded = self.detok.push(token)
            text = self._released(decoded)
            if self.finished is None and produced >= self.params.max_new_tokens:
                self.finished = LENGTH
        if complete and self.finished in (None, LENGTH):
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
        return chunk

    def _released(self, text: str) -> str:
        """Decoded text -> the part that may be sent; sets finished = STOP on a stop sequence."""
        if self.stops is None or not text:
            return text
        out = self.stops.push(text)
        if self.stops.stopped:
            self.finished = STOP
        return out

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
