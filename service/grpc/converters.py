"""Protobuf pieces every kind's converters share (`usage`, `timings`, `model_info`; generation's
and chat's `sampling_params` and `FINISH_REASONS`); each
kind's own request and response conversions are in its module here, service/grpc/<kind>.py."""

from __future__ import annotations

import dataclasses

from service.generation.decoding import SamplingParams
from service.generation.output import EOS, LENGTH, STOP
from service.models import ModelInfo
from service.proto import inference_pb2 as pb
from service.timings import Timings


def usage(input_tokens: int, output_tokens: int = 0, cached_tokens: int = 0) -> pb.Usage:
    return pb.Usage(input_tokens=input_tokens, output_tokens=output_tokens, cached_tokens=cached_tokens)


def timings(t: Timings) -> pb.Timings:
    """A core's Timings (milliseconds, service/timings.py) as the message."""
    return pb.Timings(
        tokenize_ms=t.tokenize_ms,
        queue_ms=t.queue_ms,
        inference_ms=t.inference_ms,
        total_ms=t.total_ms,
        time_to_first_token_ms=t.time_to_first_token_ms,
    )


def model_info(info: ModelInfo) -> pb.ModelInfo:
    """The models core's ModelInfo as the message."""
    return pb.ModelInfo(**dataclasses.asdict(info))


FINISH_REASONS = {
    LENGTH: pb.FINISH_REASON_LENGTH,
    STOP: pb.FINISH_REASON_STOP_SEQUENCE,
    EOS: pb.FINISH_REASON_EOS,
}


def sampling_params(request: pb.GenerateRequest | pb.ChatRequest) -> SamplingParams:
    """A GenerateRequest's or ChatRequest's sampling knobs as plain values (ranges are checked by the
    core and the model); a GenerateRequest's logprobs and echo are service/grpc/generation.py's."""
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
        speculative=request.speculative if request.HasField("speculative") else None,
    )
