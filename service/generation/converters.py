"""Protobuf <-> plain values for GenerationService (engines never see protobuf)."""

from __future__ import annotations

from service.converters import stage_timings, usage
from service.generation.core import GenerateQuery
from service.generation.decoding import SamplingParams
from service.generation.sequence import EOS, LENGTH, STOP, Chunk
from service.proto import inference_pb2 as pb

FINISH_REASONS = {
    LENGTH: pb.FINISH_REASON_LENGTH,
    STOP: pb.FINISH_REASON_STOP_SEQUENCE,
    EOS: pb.FINISH_REASON_EOS,
}


def sampling_params(request: pb.GenerateRequest) -> SamplingParams:
    """A GenerateRequest's sampling knobs as plain values (ranges are checked by the model)."""
    return SamplingParams(
        max_new_tokens=int(request.max_new_tokens),
        temperature=float(request.temperature),
        top_k=int(request.top_k),
        top_p=float(request.top_p),
        repetition_penalty=float(request.repetition_penalty),
        stop=tuple(request.stop),
        seed=int(request.seed) if request.HasField("seed") else None,
        presence_penalty=float(request.presence_penalty),
        frequency_penalty=float(request.frequency_penalty),
        min_p=float(request.min_p),
        logit_bias=tuple(sorted((int(t), float(b)) for t, b in request.logit_bias.items())),
    )


def generate_query(request: pb.GenerateRequest) -> GenerateQuery:
    """A GenerateRequest as the generation core's query (service/generation/core.py)."""
    return GenerateQuery(request.prompt, sampling_params(request), request.model, int(request.stream_interval_ms))


def generate_chunk(chunk: Chunk, model: str) -> pb.GenerateChunk:
    msg = pb.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids, model=model)
    if chunk.finish_reason is not None:
        reason, times = chunk.ending()
        msg.finish_reason = FINISH_REASONS[reason]
        msg.usage.CopyFrom(usage(chunk.input_tokens, chunk.output_tokens))
        msg.timings.CopyFrom(stage_timings(times))
    return msg


def generate_response(chunks: list[Chunk], model: str) -> pb.GenerateResponse:
    """All chunks of one generation joined: the same text and tokens a stream delivers."""
    last = chunks[-1]
    reason, times = last.ending()
    return pb.GenerateResponse(
        text="".join(c.text for c in chunks),
        token_ids=[t for c in chunks for t in c.token_ids],
        finish_reason=FINISH_REASONS[reason],
        usage=usage(last.input_tokens, last.output_tokens),
        timings=stage_timings(times),
        model=model,
    )
