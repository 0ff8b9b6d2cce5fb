"""Protobuf <-> plain values for GenerationService (engines never see protobuf)."""

from __future__ import annotations

from service.converters import usage
from service.generation import scoring
from service.generation.core import GenerateQuery
from service.generation.decoding import SamplingParams
from service.generation.sequence import EOS, LENGTH, STOP, Chunk, Timings
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
    )


def generate_query(request: pb.GenerateRequest) -> GenerateQuery:
    """A GenerateRequest as the generation core's query (service/generation/core.py)."""
    return GenerateQuery(request.prompt, sampling_params(request), request.model, int(request.stream_interval_ms))


def timings(t: Timings) -> pb.Timings:
    return pb.Timings(
        tokenize_ms=t.tokenize_ms,
        queue_ms=t.queue_ms,
        inference_ms=t.inference_ms,
        total_ms=t.total_ms,
        time_to_first_token_ms=t.time_to_first_token_ms,
    )


def generate_chunk(chunk: Chunk, model: str) -> pb.GenerateChunk:
    msg = pb.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids, model=model)
    if chunk.finish_reason is not None:
        reason, times = chunk.ending()
        msg.finish_reason = FINISH_REASONS[reason]
        msg.usage.CopyFrom(usage(chunk.input_tokens, chunk.output_tokens))
        msg.timings.CopyFrom(timings(times))
    return msg


def join_chunks(chunks: list[Chunk]) -> Chunk:
    """Consecutive chunks of one generation as one (text and tokens joined; the last one's ending)."""
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    return Chunk(
        "".join(c.text for c in chunks),
        [t for c in chunks for t in c.token_ids],
        last.finish_reason,
        last.input_tokens,
        last.output_tokens,
        last.timings,
        scoring.joined([c.logprobs for c in chunks]),
        scoring.joined([c.prompt_logprobs for c in chunks]),
    )


def generate_response(chunks: list[Chunk], model: str) -> pb.GenerateResponse:
    """All chunks of one generation joined: the same text and tokens a stream delivers."""
    last = chunks[-1]
    reason, times = last.ending()
    return pb.GenerateResponse(
        text="".join(c.text for c in chunks),
        token_ids=[t for c in chunks for t in c.token_ids],
        finish_reason=FINISH_REASONS[reason],
        usage=usage(last.input_tokens, last.output_tokens),
        timings=timings(times),
        model=model,
    )
