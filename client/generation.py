"""Client side of generation: the request builder, client mixins and the `generate` CLI command.

    with Client(address) as c:
        text = c.generate("Once upon a time", max_new_tokens=50).text
        for chunk in c.generate_stream("Once upon a time", temperature=0.8, seed=1):
            print(chunk.text, end="", flush=True)

CLI: `python -m client generate PROMPT [--max-new-tokens N --temperature T ...]` streams the text
to stdout as tokens arrive (finish reason and usage go to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from client import args as types
from service.proto import inference_pb2 as pb


def generate_request(
    prompt: str | Sequence[int],
    model: str = "",
    max_new_tokens: int = 0,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 0.0,
    repetition_penalty: float = 0.0,
    stop: Iterable[str] = (),
    seed: int | None = None,
    stream_interval_ms: int = 0,
    n: int = 0,
    logprobs: int | None = None,
    echo: bool = False,
    speculative: bool | None = None,
) -> pb.GenerateRequest:
    """prompt: a text, or token ids taken as they are (prompt_token_ids); speculative: prompt-lookup
    speculation for this request (None: the server's setting)."""
    request = pb.GenerateRequest(
        model=model,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        stop=list(stop),
        stream_interval_ms=stream_interval_ms,
        n=n,
        echo=echo,
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    if seed is not None:
        request.seed = seed
    if logprobs is not None:
        request.logprobs = logprobs
    if speculative is not None:
        request.speculative = speculative
    return request


class GenerationClientMixin:
    """Blocking generate / generate_stream; needs generation_stub and timeout."""

    generation_stub: Any
    timeout: float | None

    def generate(self, prompt: str, **kwargs: Any) -> pb.GenerateResponse:
        return self.generation_stub.Generate(generate_request(prompt, **kwargs), timeout=self.timeout)

    def generate_stream(self, prompt: str, **kwargs: Any) -> Iterator[pb.GenerateChunk]:
        """Chunks as they are generated; cancel() the returned call to stop the generation."""
        return self.generation_stub.GenerateStream(generate_request(prompt, **kwargs), timeout=self.timeout)


class AsyncGenerationClientMixin:
    """asyncio versions of GenerationClientMixin's methods."""

    generation_stub: Any
    timeout: float | None

    async def generate(self, prompt: str, **kwargs: Any) -> pb.GenerateResponse:
        return await self.generation_stub.Generate(generate_request(prompt, **kwargs), timeout=self.timeout)

    def generate_stream(self, prompt: str, **kwargs: Any) -> AsyncIterator[pb.GenerateChunk]:
        """An async iterator of chunks (a grpc.aio call: cancel() stops the generation)."""
        return self.generation_stub.GenerateStream(generate_request(prompt, **kwargs), timeout=self.timeout)


def _cmd_generate(args: argparse.Namespace, client: GenerationClientMixin) -> int:
    stream = client.generate_stream(
        args.prompt,
        model=args.model,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        stop=args.stop or (),
        seed=args.seed,
    )
    last = None
    for chunk in stream:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        last = chunk
    sys.stdout.write("\n")
    if last is not None:
        summary = {
            "finish_reason": pb.FinishReason.Name(last.finish_reason),
            "model": last.model,
            "usage": MessageToDict(last.usage, preserving_proto_field_name=True),
            "timings": MessageToDict(last.timings, preserving_proto_field_name=True),
        }
        sys.stderr.write(json.dumps(summary) + "\n")
    return 0


def add_generate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="generate text; streams it to stdout as tokens arrive")
    p.add_argument("prompt")
    p.add_argument("--model", default="", help="model name (default: the server's default)")
    p.add_argument("--max-new-tokens", type=types.count, default=0, help="0: the server default")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=types.count, default=0, help="0: off")
    p.add_argument("--top-p", type=float, default=0.0, help="0 or 1: off")
    p.add_argument("--repetition-penalty", type=float, default=0.0, help="0: off; 1: neutral")
    p.add_argument("--stop", action="append", help="a stop sequence (repeatable)")
    p.add_argument("--seed", type=types.seed, default=None, help="same seed, same output")
    p.set_defaults(handler=_cmd_generate)
    return p
