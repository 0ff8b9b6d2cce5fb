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

import asyncio
import time
import uuid
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.errors import InvalidArgument
from service.generation.constraint import Structure, structure_of
from service.generation.core import EOS, LENGTH, STOP, Chunk, GenerateQuery, Generation
from service.generation.decoding import SamplingParams
from service.generation.query import MAX_N
from service.generation.scoring import TokenLogprobs
from service.http import schemas
from service.http.errors import HttpCall
from service.http.schemas import FLOAT32, PENALTIES, UINT64, Field, fields, refuse_unsupported

Prompt = schemas.Prompt
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


_FIELDS = (  # in the order they are checked: the first bad one is refused
    Field("n", int, 1),
    Field("best_of", int, None, minimum=1, maximum=MAX_N),  # absent: n
    Field("echo", bool, False),
    Field("max_tokens", int, None, minimum=0),
    Field("temperature", float, 0.0, minimum=0, maximum=FLOAT32),
    Field("top_p", float, 0.0, minimum=0, maximum=FLOAT32),
    Field("top_k", int, 0, minimum=0),
    Field("repetition_penalty", float, 0.0, minimum=0, maximum=FLOAT32),
    Field("stop", list, []),
    Field("seed", int, minimum=0, maximum=UINT64),
    Field("logprobs", int, None),
    *PENALTIES,
    Field("stream", bool, False),
    Field("model", str, ""),
)
_PARAMS = [f.name for f in _FIELDS if f.name not in ("n", "best_of", "echo", "max_tokens", "stream", "model")]


def parse(body: dict, max_prompts: int) -> CompletionRequest:
    """The request's fields, checked as JSON; refusals name the field (InvalidArgument). The ranges
    of n, logprobs and the sampling parameters are the core's. max_prompts: gen_max_queue, as many
    generations as one call may hold."""
    refuse_unsupported(body, {"suffix": None})
    prompts = schemas.prompts(body.get("prompt"), max_prompts)
    v = fields(body, _FIELDS)
    n, echo, max_tokens, stream = v["n"], v["echo"], v["max_tokens"], v["stream"]
    if v["best_of"] not in (None, n):
        raise InvalidArgument(f"best_of={v['best_of']} is not supported (leave it out or set it to n={n})")
    if stream and len(prompts) > 1:
        raise InvalidArgument("stream is supported for one prompt; send the others as separate requests")
    if max_tokens == 0 and not echo:
        max_tokens = None  # the server's default length, as before echo existed (docs/api.md)
    params = SamplingParams(
        max_new_tokens=max_tokens or 0,
        score_only=max_tokens == 0,
        **{k: v[k] for k in _PARAMS},
    )
    queries = [
        GenerateQuery(p, params, v["model"], prompt_name=_name(prompts, i), n=n, echo=echo, stream=stream)
        for i, p in enumerate(prompts)
    ]
    return CompletionRequest(queries, n, stream, structure_of(body))


def _name(prompts: list[Prompt], i: int) -> str:
    return "prompt" if len(prompts) == 1 else f"prompt[{i}]"


async def answer(request: Request, call: HttpCall, query: CompletionRequest, generations: list[Generation]) -> Response:
    """The admitted generations as the JSON response, or (stream) as its events; every generation
    is cancelled once the call is done with it, or when anything fails before a stream took it."""
    try:
        completion = Completion(generations[0].model)
        if query.stream:  # the stream cancels its generation when it ends (client gone, deadline)
            events = (event(completion, chunk) async for chunk in generations[0].batches())
            return call.stream(events, on_close=generations[0].cancel)
        try:  # one wake-up per choice
            results = await call.unless_gone(request, asyncio.gather(*(g.collect() for g in generations)))
        finally:
            for generation in generations:
                generation.cancel()
        return JSONResponse(response(query, completion, list(results)))
    except BaseException:
        for generation in generations:
            generation.cancel()
        raise


def response(request: CompletionRequest, completion: Completion, results: list[list[Chunk]]) -> dict:
    """The completion response: results, each prompt's choices (the core's collect())."""
    choices, prompt_tokens, completion_tokens, cached = [], 0, 0, 0
    for i, chunks in enumerate(results):
        prompt_tokens += chunks[0].input_tokens
        cached += chunks[0].cached_tokens
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
        "usage": usage(prompt_tokens, completion_tokens, cached),
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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens taken from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
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
        out["usage"] = usage(chunk.input_tokens, chunk.output_tokens, chunk.cached_tokens)
    return out
