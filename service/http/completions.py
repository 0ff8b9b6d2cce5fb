"""OpenAI's completions request and response beyond one prompt: prompts as text or token ids, `n`
choices, `logprobs`, `echo` (docs/design/scoring.md).

`parse(body)` checks the JSON and returns the plain request; `choice_params(request, j)` the
SamplingParams of choice j of a prompt; `Choice` turns one choice's chunks (the core's token texts
and widths, no tokenizer here) into OpenAI's `text` and `logprobs` object, chunk by chunk (a stream)
or all at once:

    "logprobs": {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}, ...],
                 "text_offset": [...]}

With `echo` the prompt's tokens come first, the first one's log-probability and alternatives
`null` (nothing predicts it). `top_logprobs` holds the `logprobs` most likely tokens of each
position and the chosen one (up to logprobs + 1 entries, as OpenAI documents). `text_offset` is
each token's character offset in the prompt followed by the completion (OpenAI's convention; vLLM
counts from the completion's start without echo); a special token the text leaves out is zero wide.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass

from service.errors import InvalidArgument
from service.generation.constraint import Structure, structure_of
from service.generation.core import EOS, LENGTH, STOP, Chunk
from service.generation.decoding import SamplingParams
from service.generation.scoring import TokenLogprobs
from service.http.schemas import FLOAT32, UINT64, field, penalties, refuse_unsupported, strings, text

MAX_LOGPROBS = 5  # OpenAI's limit for completions
MAX_N = 16  # choices per prompt

Prompt = str | list[int]
FINISH = {EOS: "stop", STOP: "stop", LENGTH: "length"}  # OpenAI has no separate "end of text" reason


class Completion:
    """The id and timestamp one completion's response or stream events share."""

    def __init__(self, model: str):
        self.id, self.created, self.model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), model


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: list[Prompt]
    n: int
    echo: bool
    logprobs: int | None  # alternatives per token; None: no logprobs object
    params: SamplingParams  # what every choice shares (its seed is choice 0's)
    stream: bool
    structure: Structure | None = None  # response_format / structured_outputs (constraint.py)


def parse(body: dict) -> CompletionRequest:
    """The request's fields, checked; refusals name the field (InvalidArgument)."""
    refuse_unsupported(body, {"suffix": None})
    prompts = parse_prompts(body.get("prompt"))
    n = field(body, "n", int, 1, minimum=1, maximum=MAX_N)
    best_of = field(body, "best_of", int, n, minimum=1, maximum=MAX_N)
    if best_of != n:
        raise InvalidArgument(f"best_of={best_of} is not supported (leave it out or set it to n={n})")
    echo = field(body, "echo", bool, False)
    logprobs = field(body, "logprobs", int, None, minimum=0, maximum=MAX_LOGPROBS)
    max_tokens = field(body, "max_tokens", int, None, minimum=0)
    if max_tokens == 0 and not echo:
        max_tokens = None  # the server's default length, as before echo existed (docs/api.md)
    params = SamplingParams(
        max_new_tokens=max_tokens or 0,
        temperature=field(body, "temperature", float, 0.0, minimum=0, maximum=FLOAT32),
        top_p=field(body, "top_p", float, 0.0, minimum=0, maximum=FLOAT32),
        top_k=field(body, "top_k", int, 0, minimum=0),
        repetition_penalty=field(body, "repetition_penalty", float, 0.0, minimum=0, maximum=FLOAT32),
        stop=tuple(strings(body, "stop", default=[])),
        seed=field(body, "seed", int, minimum=0, maximum=UINT64),
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo and logprobs is not None else 0 if max_tokens == 0 else None,
        score_only=max_tokens == 0,
        **penalties(body),
    )
    stream = field(body, "stream", bool, False)
    if stream and len(prompts) * n > 1:
        raise InvalidArgument("stream is supported for one prompt and n=1; send the others as separate requests")
    model = field(body, "model", str, "")
    return CompletionRequest(model, prompts, n, echo, logprobs, params, stream, structure_of(body))


def parse_prompts(value) -> list[Prompt]:
    """A string, an array of strings, an array of token ids, or an array of arrays of token ids."""
    if isinstance(value, str):
        return [text("prompt", value)]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return [text(f"prompt[{i}]", v) for i, v in enumerate(value)]
        if all(_is_id(v) for v in value):
            return [list(value)]
        if all(isinstance(v, list) for v in value):
            for i, ids in enumerate(value):
                bad = next((j for j, t in enumerate(ids) if not _is_id(t)), None)
                if bad is not None or not ids:
                    where = f"prompt[{i}]" if bad is None else f"prompt[{i}][{bad}]"
                    raise InvalidArgument(f"{where} must be a non-empty array of token ids (integers)")
            return [list(v) for v in value]
    raise InvalidArgument(
        "prompt must be a string, an array of strings, an array of token ids or an array of "
        "arrays of token ids (not empty, not mixed)"
    )


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def choice_params(request: CompletionRequest, j: int) -> SamplingParams:
    """Choice j of a prompt: its own seed stream (seed + j; unseeded stays unseeded) and, with echo,
    the prompt scored once, by choice 0 (the prompt's other choices share its scores). A score-only
    request runs choice 0 alone: its choices are all alike."""
    p = request.params
    seed = None if p.seed is None else (p.seed + j) % 2**64
    return dataclasses.replace(p, seed=seed, prompt_logprobs=p.prompt_logprobs if j == 0 else None)


def runs(request: CompletionRequest) -> list[tuple[int, int]]:
    """(prompt index, choice j) of each generation to run."""
    n = 1 if request.params.score_only else request.n
    return [(i, j) for i in range(len(request.prompts)) for j in range(n)]


def response(
    request: CompletionRequest, completion: Completion, prompts: list[str], results: dict[tuple[int, int], Chunk]
) -> dict:
    """The completion response: prompts, each prompt as text; results (prompt, choice) -> the
    choice's joined chunk; a score-only request's choice 0 stands for all n."""
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, prompt in enumerate(prompts):
        first = results[(i, 0)]
        prompt_tokens += first.input_tokens
        for j in range(request.n):
            chunk = results.get((i, j), first)
            choice = Choice(prompt, request.echo, request.logprobs)
            text, lp = choice.part(chunk, first.prompt_logprobs)
            completion_tokens += chunk.output_tokens if (i, j) in results else 0
            choices.append(
                {"index": i * request.n + j, "text": text, "logprobs": lp, "finish_reason": FINISH[chunk.ending()[0]]}
            )
    return {
        "id": completion.id,
        "object": "text_completion",
        "created": completion.created,
        "model": completion.model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


class Choice:
    """One choice's `text` and `logprobs`, built from its chunks in order, from the core's values
    alone (each token's text and width come with its scores). prompt_scores: the prompt's scores
    when echo is on (choice 0 brings them in its first chunk; the others share them)."""

    def __init__(self, prompt_text: str, echo: bool, top: int | None):
        self.prompt_text, self.echo, self.top = prompt_text, echo, top
        self.offset = len(prompt_text)  # the next generated token's text offset
        self._echoed = not echo

    def part(self, chunk: Chunk, prompt_scores: TokenLogprobs | None = None) -> tuple[str, dict | None]:
        """(text, logprobs object or None) of one chunk (or of a whole choice's joined chunks)."""
        scores = prompt_scores or chunk.prompt_logprobs
        text, lp = chunk.text, self._empty() if self.top is not None else None
        if not self._echoed:
            self._echoed = True
            text = self.prompt_text + text
            if lp is not None and scores is not None:
                self._add(lp, scores, _offsets(scores.widths, 0))
        if lp is not None and chunk.logprobs is not None:
            offsets = _offsets(chunk.logprobs.widths, self.offset)
            self.offset += sum(chunk.logprobs.widths)
            self._add(lp, chunk.logprobs, offsets)
        return text, lp

    @staticmethod
    def _empty() -> dict:
        return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def _add(self, lp: dict, scores: TokenLogprobs, offsets: list[int]) -> None:
        for i, (name, value) in enumerate(zip(scores.tokens, scores.logprobs, strict=True)):
            lp["tokens"].append(name)
            lp["token_logprobs"].append(value)
            lp["text_offset"].append(offsets[i])
            if value is None:  # a prompt's first token
                lp["top_logprobs"].append(None)
                continue
            top: dict[str, float] = {}
            for t, v in zip(scores.top_tokens[i][: self.top], scores.top_logprobs[i], strict=False):
                top.setdefault(t, v)  # two ids may decode alike: the likelier one is kept
            top.setdefault(name, value)
            lp["top_logprobs"].append(top)


def _offsets(widths: list[int], start: int) -> list[int]:
    """Each token's character offset: start, then past the characters of the tokens before it."""
    out, at = [], start
    for width in widths:
        out.append(at)
        at += width
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def event(completion: Completion, choice: Choice, chunk: Chunk) -> dict:
    """A stream event of a one-choice completion; the last one carries the finish reason and usage."""
    text, lp = choice.part(chunk)
    reason = None if chunk.finish_reason is None else FINISH[chunk.finish_reason]
    out = {
        "id": completion.id,
        "object": "text_completion",
        "created": completion.created,
        "model": completion.model,
        "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}],
    }
    if reason is not None:
        out["usage"] = usage(chunk.input_tokens, chunk.output_tokens)
    return out
