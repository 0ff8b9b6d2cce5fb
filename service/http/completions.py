"""OpenAI's completions request and response shapes: prompts as text or token ids, `n` choices,
`logprobs`, `echo` (docs/design/scoring.md). The generation core does the work of each (choices,
echo, scores, text offsets: service/generation/query.py); this module only reads and writes JSON.

`parse(body)` checks the JSON and returns the core's queries, one per prompt; `response` and
`event` write the core's chunks as OpenAI's `text` and `logprobs` object:

    "logprobs": {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}, ...],
                 "text_offset": [...]}

`top_logprobs` holds the `logprobs` most likely tokens of each position and the chosen one (up to
logprobs + 1 entries, as OpenAI documents; two ids whose texts are alike share a key, the likelier
kept); an echoed prompt's first token has `null` for both (nothing predicts it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from service.errors import InvalidArgument
from service.generation.constraint import Structure, structure_of
from service.generation.core import EOS, LENGTH, STOP, Chunk, GenerateQuery
from service.generation.decoding import SamplingParams
from service.generation.query import MAX_N
from service.generation.scoring import TokenLogprobs
from service.http.schemas import FLOAT32, UINT64, count, field, penalties, refuse_unsupported, strings, text

Prompt = str | list[int]
FINISH = {EOS: "stop", STOP: "stop", LENGTH: "length"}  # OpenAI has no separate "end of text" reason


class Completion:
    """The id and timestamp one completion's response or stream events share."""

    def __init__(self, model: str):
        self.id, self.created, self.model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), model


@dataclass(frozen=True)
class CompletionRequest:
    queries: list[GenerateQuery]  # one per prompt, each with its n choices
    n: int
    stream: bool
    structure: Structure | None = None  # response_format / structured_outputs (constraint.py)


def parse(body: dict, max_prompts: int) -> CompletionRequest:
    """The request's fields, checked as JSON; refusals name the field (InvalidArgument). The ranges
    of n, logprobs and the sampling parameters are the core's. max_prompts: gen_max_queue, as many
    generations as one call may hold."""
    refuse_unsupported(body, {"suffix": None})
    prompts = parse_prompts(body.get("prompt"), max_prompts)
    n = field(body, "n", int, 1)
    best_of = field(body, "best_of", int, n, minimum=1, maximum=MAX_N)
    if best_of != n:
        raise InvalidArgument(f"best_of={best_of} is not supported (leave it out or set it to n={n})")
    echo = field(body, "echo", bool, False)
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
        logprobs=field(body, "logprobs", int, None),
        score_only=max_tokens == 0,
        **penalties(body),
    )
    stream = field(body, "stream", bool, False)
    if stream and len(prompts) > 1:
        raise InvalidArgument("stream is supported for one prompt; send the others as separate requests")
    model = field(body, "model", str, "")
    queries = [
        GenerateQuery(p, params, model, prompt_name=_name(prompts, i), n=n, echo=echo, stream=stream)
        for i, p in enumerate(prompts)
    ]
    return CompletionRequest(queries, n, stream, structure_of(body))


def _name(prompts: list[Prompt], i: int) -> str:
    return "prompt" if len(prompts) == 1 else f"prompt[{i}]"


def parse_prompts(value, max_prompts: int) -> list[Prompt]:
    """A string, an array of strings, an array of token ids, or an array of arrays of token ids. The
    prompts are counted before any is looked at; token ids are the model's to check, after their
    count (GenerationModel.check_ids): per-element work only within the limits."""
    if isinstance(value, str):
        return [text("prompt", value)]
    if isinstance(value, list) and value:
        if _is_id(value[0]):
            return [value]
        count("prompt", value, max_prompts, "gen_max_queue")
        if all(isinstance(v, str) for v in value):
            return [text(f"prompt[{i}]", v) for i, v in enumerate(value)]
        if all(isinstance(v, list) for v in value):
            return value
    raise InvalidArgument(
        "prompt must be a string, an array of strings, an array of token ids or an array of "
        "arrays of token ids (not empty, not mixed)"
    )


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def response(request: CompletionRequest, completion: Completion, results: list[list[Chunk]]) -> dict:
    """The completion response: results, each prompt's choices (the core's collect())."""
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, chunks in enumerate(results):
        prompt_tokens += chunks[0].input_tokens
        for j, chunk in enumerate(chunks):
            completion_tokens += chunk.output_tokens
            lp, reason = logprobs(chunk.logprobs), FINISH[chunk.ending()[0]]
            choices.append({"index": i * request.n + j, "text": chunk.text, "logprobs": lp, "finish_reason": reason})
    return {
        "id": completion.id,
        "object": "text_completion",
        "created": completion.created,
        "model": completion.model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def logprobs(scores: TokenLogprobs | None) -> dict | None:
    """The core's scores (with their text offsets) as OpenAI's logprobs object; None: not asked."""
    if scores is None:
        return None
    top: list[dict[str, float] | None] = []
    for i, (name, value) in enumerate(zip(scores.tokens, scores.logprobs, strict=True)):
        if value is None:  # an echoed prompt's first token
            top.append(None)
            continue
        alternatives: dict[str, float] = {}
        for t, v in zip(scores.top_tokens[i], scores.top_logprobs[i], strict=True):
            alternatives.setdefault(t, v)  # two ids may decode alike: the likelier one is kept
        alternatives.setdefault(name, value)
        top.append(alternatives)
    return {
        "tokens": scores.tokens,
        "token_logprobs": scores.logprobs,
        "top_logprobs": top,
        "text_offset": scores.offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def event(completion: Completion, chunk: Chunk) -> dict:
    """A stream event of a one-choice completion; the last one carries the finish reason and usage."""
    reason = None if chunk.finish_reason is None else FINISH[chunk.finish_reason]
    out = {
        "id": completion.id,
        "object": "text_completion",
        "created": completion.created,
        "model": completion.model,
        "choices": [{"index": 0, "text": chunk.text, "logprobs": logprobs(chunk.logprobs), "finish_reason": reason}],
    }
    if reason is not None:
        out["usage"] = usage(chunk.input_tokens, chunk.output_tokens)
    return out
