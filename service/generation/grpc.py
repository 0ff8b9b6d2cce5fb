"""GenerationService over gRPC: protobuf -> the generation core (service/generation/core.py) -> protobuf.

A generation is cancelled in `finally`, so a client that goes away (cancel, deadline) or a server
shutdown frees its cache row at the scheduler's next step. A stream joins the chunks posted while
its previous message was written into one message (the joined stream still equals the unary
response): fewer messages when the server is busiest. With `stream_interval_ms` the stream also
waits that long after each message, so a message carries every token of that interval. Unary
Generate waits for the whole generation once instead of at every step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from service.cores import Cores
from service.errors import InvalidArgument, deadline_of, grpc_errors
from service.generation import chat_converters, converters
from service.generation.chat import ChatCore
from service.generation.core import GenerationCore, join_chunks
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc


class GenerationServicer(pb_grpc.GenerationServiceServicer):
    def __init__(self, core: GenerationCore):
        self.core, self.chats = core, ChatCore(core)

    @grpc_errors("GenerationService")
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        generation = await self.core.generate(converters.generate_query(request), deadline_of(context))
        try:
            chunks = await generation.collect()
        finally:
            generation.cancel()
        return converters.generate_response(chunks, generation.model)

    @grpc_errors("GenerationService")
    async def GenerateStream(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateChunk]:
        generation = await self.core.generate(converters.generate_query(request), deadline_of(context))
        interval = generation.interval_s
        try:
            sent = None
            async for chunk in generation:
                if interval and sent is not None and chunk.finish_reason is None:
                    pause = sent + interval - time.monotonic()
                    if pause > 0:
                        await asyncio.sleep(pause)  # the tokens of the pause join this message
                # Chunks posted while the previous message was written (or during the pause) go out as one.
                yield converters.generate_chunk(join_chunks([chunk, *generation.ready()]), generation.model)
                sent = time.monotonic()
        finally:
            generation.cancel()

    @grpc_errors("GenerationService")
    async def Chat(self, request: pb.ChatRequest, context: grpc.aio.ServicerContext) -> pb.ChatResponse:
        query, tool_choice = chat_converters.chat_query(request)
        chat = await self.chats.chat(query, deadline_of(context))
        try:
            choices = await asyncio.gather(*(g.collect() for g in chat.generations))
        finally:
            chat.cancel()
        return chat_converters.chat_response(list(choices), chat, tool_choice)

    @grpc_errors("GenerationService")
    async def ChatStream(
        self, request: pb.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ChatChunk]:
        query, tool_choice = chat_converters.chat_query(request)
        if query.n > 1:
            raise InvalidArgument("ChatStream streams one choice (n=1); call Chat for several")
        chat = await self.chats.chat(query, deadline_of(context))
        generation, splitter = chat.generations[0], chat.splitter()
        try:
            if tool_choice.mode != "none":  # tool calls are parsed from the whole reply
                whole = await generation.collect()
                yield chat_converters.whole_chunk(chat_converters.chat_response([whole], chat, tool_choice))
                return
            async for chunk in generation:
                yield chat_converters.chat_chunk(join_chunks([chunk, *generation.ready()]), splitter, chat.model)
        finally:
            chat.cancel()


def register(server: grpc.aio.Server, cores: Cores) -> None:
    pb_grpc.add_GenerationServiceServicer_to_server(GenerationServicer(cores.generation), server)
