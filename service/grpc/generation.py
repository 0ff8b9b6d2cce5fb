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
import dataclasses
import time
from collections.abc import AsyncIterator

import grpc

from service.cores import Cores
from service.errors import InvalidArgument, deadline_of, grpc_errors
from service.generation.chat import ChatCore
from service.generation.constraint import structure_of
from service.generation.core import Chunk, GenerateQuery, GenerationCore, join_chunks
from service.generation.scoring import TokenLogprobs
from service.grpc import chat as chat_converters
from service.grpc.converters import FINISH_REASONS, sampling_params, timings, usage
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc


def generate_query(request: pb.GenerateRequest, stream: bool = False) -> GenerateQuery:
    """A GenerateRequest as the generation core's query (service/generation/core.py)."""
    prompt: str | list[int] = request.prompt
    name = "prompt"
    if request.prompt_token_ids:
        if request.prompt:
            raise InvalidArgument("send prompt or prompt_token_ids, not both")
        prompt, name = list(request.prompt_token_ids), "prompt_token_ids"
    params = dataclasses.replace(
        sampling_params(request),
        logprobs=int(request.logprobs) if request.HasField("logprobs") else None,
        score_only=request.echo and request.max_new_tokens == 0,
    )
    return GenerateQuery(
        prompt,
        params,
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
        msg.usage.CopyFrom(usage(chunk.input_tokens, chunk.output_tokens, chunk.cached_tokens))
        msg.timings.CopyFrom(timings(times))
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
        usage=usage(first.input_tokens, sum(c.output_tokens for c in choices), first.cached_tokens),
        timings=timings(times),
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


class GenerationServicer(pb_grpc.GenerationServiceServicer):
    def __init__(self, core: GenerationCore):
        self.core, self.chats = core, ChatCore(core)

    async def _constrained(self, request: pb.GenerateRequest, query: GenerateQuery) -> GenerateQuery:
        """The query with its structured output compiled once for every choice (each row copies it)."""
        structure = structure_of(chat_converters.structure_fields(request))
        if structure is None:
            return query
        compiled = await self.chats.model(query.model).constraints.compile(structure)
        return dataclasses.replace(query, params=dataclasses.replace(query.params, constraint=compiled))

    @grpc_errors("GenerationService")
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        query = await self._constrained(request, generate_query(request))
        generation = await self.core.generate(query, deadline_of(context))
        try:
            chunks = await generation.collect()
        finally:
            generation.cancel()
        return generate_response(chunks, generation.model)

    @grpc_errors("GenerationService")
    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateChunk]:
        query = await self._constrained(request, generate_query(request, stream=True))
        generation = await self.core.generate(query, deadline_of(context))
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

    @grpc_errors("GenerationService")
    async def Chat(self, request: pb.ChatRequest, context: grpc.aio.ServicerContext) -> pb.ChatResponse:
        query, tool_choice = chat_converters.chat_query(request)
        chat = await self.chats.chat(query, deadline_of(context))
        try:
            choices = await chat.generation.collect()
        finally:
            chat.cancel()
        return chat_converters.chat_response(choices, chat, tool_choice)

    @grpc_errors("GenerationService")
    async def ChatStream(
        self, request: pb.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ChatChunk]:
        query, tool_choice = chat_converters.chat_query(request)
        if query.n > 1:
            raise InvalidArgument("ChatStream streams one choice (n=1); call Chat for several")
        chat = await self.chats.chat(query, deadline_of(context))
        generation, splitter = chat.generation, chat.splitter()
        try:
            if tool_choice.mode != "none":  # tool calls are parsed from the whole reply
                whole = await generation.collect()
                yield chat_converters.whole_chunk(chat_converters.chat_response(whole, chat, tool_choice))
                return
            async for chunk in generation:
                yield chat_converters.chat_chunk(join_chunks([chunk, *generation.ready()]), splitter, chat.model)
        finally:
            chat.cancel()


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_GenerationServiceServicer_to_server(GenerationServicer(cores.generation), server)
