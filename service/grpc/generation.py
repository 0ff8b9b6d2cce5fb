"""GenerationService over gRPC: protobuf -> the generation core (service/generation/core.py) -> protobuf.

A generation is cancelled in `finally`, so a client that goes away (cancel, deadline) or a server
shutdown frees its cache row at the scheduler's next step. A stream joins the chunks posted while
its previous message was written into one message (the joined stream still equals the unary
response): fewer messages when the server is busiest. With `stream_interval_ms` the stream also
waits that long after each message, so a message carries every token of that interval. Unary
Generate waits for the whole generation once instead of at every step. The KServe door makes its
queries with `generate_query` too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from service.cores import Cores
from service.errors import deadline_of, grpc_errors
from service.generation.core import GenerateQuery, GenerationCore, join_chunks
from service.generation.decoding import SamplingParams
from service.generation.sequence import EOS, LENGTH, STOP, Chunk
from service.grpc.converters import timings, usage
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

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


def generate_chunk(chunk: Chunk, model: str) -> pb.GenerateChunk:
    msg = pb.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids, model=model)
    if chunk.finish_reason is not None:
        reason, times = chunk.ending()
        msg.finish_reason = FINISH_REASONS[reason]
        msg.usage.CopyFrom(usage(chunk.input_tokens, chunk.output_tokens))
        msg.timings.CopyFrom(timings(times))
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
        timings=timings(times),
        model=model,
    )


class GenerationServicer(pb_grpc.GenerationServiceServicer):
    def __init__(self, core: GenerationCore):
        self.core = core

    @grpc_errors("GenerationService")
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        generation = await self.core.generate(generate_query(request), deadline_of(context))
        try:
            chunks = await generation.collect()
        finally:
            generation.cancel()
        return generate_response(chunks, generation.model)

    @grpc_errors("GenerationService")
    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateChunk]:
        generation = await self.core.generate(generate_query(request), deadline_of(context))
        interval = generation.interval_s
        try:
            sent = None
            async for chunk in generation:
                if interval and sent is not None and chunk.finish_reason is None:
                    pause = sent + interval - time.monotonic()
                    if pause > 0:
                        await asyncio.sleep(pause)  # the tokens of the pause join this message
                # Chunks posted while the previous message was written (or during the pause) go out as one.
                yield generate_chunk(join_chunks([chunk, *generation.ready()]), generation.model)
                sent = time.monotonic()
        finally:
            generation.cancel()


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_GenerationServiceServicer_to_server(GenerationServicer(cores.generation), server)
