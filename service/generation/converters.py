"""Protobuf <-> plain values for GenerationService (engines never see protobuf)."""

from __future__ import annotations

from service.converters import stage_timings, usage
from service.errors import InvalidArgument
from service.generation.core import EOS, LENGTH, STOP, Chunk, GenerateQuery
from service.generation.decoding import SamplingParams
from service.generation.scoring import TokenLogprobs
from service.proto import inference_pb2 as pb

FINISH_REASONS = {
    LENGTH: pb.FINISH_REASON_LENGTH,
    STOP: pb.FINISH_REASON_STOP_SEQUENCE,
    EOS: pb.FINISH_REASON_EOS,
}


def sampling_params(request: pb.GenerateRequest) -> SamplingParams:
    """A GenerateRequest's sampling knobs as plain values (ranges are checked by the core and the model)."""
    return SamplingParams(
        max_new_tokens=int(request.max_new_tokens),
        temperature=float(request.temperature),
        top_k=int(request.top_k),
        top_p=float(request.top_p),
        repetition_penalty=float(request.repetition_penalty),
        stop=tuple(request.stop),
        seed=int(request.seed) if request.HasField("seed") else None,
        logprobs=int(request.logprobs) if request.HasField("logprobs") else None,
        score_only=request.echo and request.max_new_tokens == 0,
    )


def generate_query(request: pb.GenerateRequest, stream: bool = False) -> GenerateQuery:
    """A GenerateRequest as the generation core's query (service/generation/core.py)."""
    prompt: str | list[int] = request.prompt
    name = "prompt"
    if request.prompt_token_ids:
        if request.prompt:
            raise InvalidArgument("send prompt or prompt_token_ids, not both")
        prompt, name = list(request.prompt_token_ids), "prompt_token_ids"
    return GenerateQuery(
        prompt,
        sampling_params(request),
        request.model,
        int(request.stream_interval_ms),
        prompt_name=name,
        n=int(request.n) or 1,
        echo=request.echo,
        stream=stream,
    )


def token_logprobs(scores: TokenLogprobs | None) -> list[pb.TokenLogprob]:
    """The core's scores (query.py: with their text offsets) as TokenLogprob messages."""
    if scores is None:
        return []
    return [
        pb.TokenLogprob(
            token_id=token,
            token=scores.tokens[i],
            logprob=value,
            top=[
                pb.TopLogprob(token_id=t, token=name, logprob=v)
                for t, name, v in zip(scores.top_ids[i], scores.top_tokens[i], scores.top_logprobs[i], strict=True)
            ],
            text_offset=scores.offsets[i],
        )
        for i, (token, value) in enumerate(zip(scores.token_ids, scores.logprobs, strict=True))
    ]


def generate_chunk(chunk: Chunk, model: str) -> pb.GenerateChunk:
    msg = pb.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids, model=model)
    msg.logprobs.extend(token_logprobs(chunk.logprobs))
    if chunk.finish_reason is not None:
        reason, times = chunk.ending()
        msg.finish_reason = FINISH_REASONS[reason]
        msg.usage.CopyFrom(usage(chunk.input_tokens, chunk.output_tokens))
        msg.timings.CopyFrom(stage_timings(times))
    return msg


def generate_response(choices: list[Chunk], model: str) -> pb.GenerateResponse:
    """Every choice's joined chunk (the core's collect()): choice 0 in the top fields (the same text
    and tokens a stream delivers), all of them in `choices` when there are several."""
    first = choices[0]
    reason, times = first.ending()
    response = pb.GenerateResponse(
        text=first.text,
        token_ids=first.token_ids,
        finish_reason=FINISH_REASONS[reason],
        usage=usage(first.input_tokens, sum(c.output_tokens for c in choices)),
        timings=stage_timings(times),
        model=model,
        logprobs=token_logprobs(first.logprobs),
    )
    if len(choices) > 1:
        response.choices.extend(
            pb.GenerateChoice(
                index=j,
                text=c.text,
                token_ids=c.token_ids,
                finish_reason=FINISH_REASONS[c.ending()[0]],
                logprobs=token_logprobs(c.logprobs),
            )
            for j, c in enumerate(choices)
        )
    return response
