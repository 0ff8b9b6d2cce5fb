"""Client side of translation: the request builder, client mixins and the `translate` CLI command.

    with Client(address) as c:
        response = c.translate(["Hello."], beam_size=4)   # TranslateResponse

CLI: `python -m client translate TEXT... [--beam-size K]` prints the TranslateResponse as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from google.protobuf.json_format import MessageToDict

from client import args as types
from service.proto import inference_pb2 as pb


def translate_request(
    inputs: Iterable[str], model: str = "", beam_size: int = 0, max_length: int = 0, length_penalty: float = 0.0
) -> pb.TranslateRequest:
    return pb.TranslateRequest(
        inputs=list(inputs), model=model, beam_size=beam_size, max_length=max_length, length_penalty=length_penalty
    )


class TranslationClientMixin:
    """Blocking translate; needs translation_stub and timeout."""

    translation_stub: Any
    timeout: float | None

    def translate(self, inputs: Iterable[str], **kwargs: Any) -> pb.TranslateResponse:
        return self.translation_stub.Translate(translate_request(inputs, **kwargs), timeout=self.timeout)


class AsyncTranslationClientMixin:
    """The asyncio version of TranslationClientMixin."""

    translation_stub: Any
    timeout: float | None

    async def translate(self, inputs: Iterable[str], **kwargs: Any) -> pb.TranslateResponse:
        return await self.translation_stub.Translate(translate_request(inputs, **kwargs), timeout=self.timeout)


def _cmd_translate(args: argparse.Namespace, client: TranslationClientMixin) -> int:
    response = client.translate(
        args.texts,
        model=args.model,
        beam_size=args.beam_size,
        max_length=args.max_length,
        length_penalty=args.length_penalty,
    )
    sys.stdout.write(
        json.dumps(MessageToDict(response, preserving_proto_field_name=True), indent=2, ensure_ascii=False) + "\n"
    )
    return 0


def add_translate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("translate", help="translate texts; prints the TranslateResponse as JSON")
    p.add_argument("texts", nargs="+")
    p.add_argument("--model", default="", help="model name (default: the server's default)")
    p.add_argument("--beam-size", type=types.count, default=0, help="0 or 1: greedy")
    p.add_argument("--max-length", type=types.count, default=0, help="max target tokens (0: the model's default)")
    p.add_argument("--length-penalty", type=float, default=0.0, help="0: default 1.0")
    p.set_defaults(handler=_cmd_translate)
    return p
