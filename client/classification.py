"""Client side of rerank and classify: request builders, client mixins and the `rerank` / `classify` CLI commands.

    with Client(address) as c:
        response = c.rerank("what is a cat?", ["a cat is a small feline", "paris"], top_n=1)  # RerankResponse
        response = c.classify(["great film", ("the query", "a document")])                  # ClassifyResponse

CLI: `python -m client rerank QUERY DOC... [--top-n N] [--raw-scores]` and
`python -m client classify TEXT... [--pair TEXT]` print the response as JSON.
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


def rerank_request(
    query: str,
    documents: Iterable[str],
    model: str = "",
    top_n: int | None = None,
    raw_scores: bool = False,
    truncate: bool | None = None,
    return_documents: bool = False,
) -> pb.RerankRequest:
    """A RerankRequest; top_n None: every document, best first."""
    request = pb.RerankRequest(
        query=query, documents=list(documents), model=model, raw_scores=raw_scores, return_documents=return_documents
    )
    if top_n is not None:
        request.top_n = top_n
    if truncate is not None:
        request.truncate = truncate
    return request


def classify_request(
    inputs: Iterable[str | tuple[str, str]], model: str = "", raw_scores: bool = False, truncate: bool | None = None
) -> pb.ClassifyRequest:
    """A ClassifyRequest: each input a text, or a (text, text_pair) tuple."""
    items = [
        pb.ClassifyInput(text=x) if isinstance(x, str) else pb.ClassifyInput(text=x[0], text_pair=x[1]) for x in inputs
    ]
    request = pb.ClassifyRequest(inputs=items, model=model, raw_scores=raw_scores)
    if truncate is not None:
        request.truncate = truncate
    return request


class ClassificationClientMixin:
    """Blocking rerank and classify; needs classification_stub and timeout."""

    classification_stub: Any
    timeout: float | None

    def rerank(self, query: str, documents: Iterable[str], **kwargs: Any) -> pb.RerankResponse:
        """Documents scored against the query, best first (kwargs: model, top_n, raw_scores, truncate,
        return_documents)."""
        return self.classification_stub.Rerank(rerank_request(query, documents, **kwargs), timeout=self.timeout)

    def classify(self, inputs: Iterable[str | tuple[str, str]], **kwargs: Any) -> pb.ClassifyResponse:
        """Every label's score per input, best first (kwargs: model, raw_scores, truncate)."""
        return self.classification_stub.Classify(classify_request(inputs, **kwargs), timeout=self.timeout)


class AsyncClassificationClientMixin:
    """The asyncio version of ClassificationClientMixin."""

    classification_stub: Any
    timeout: float | None

    async def rerank(self, query: str, documents: Iterable[str], **kwargs: Any) -> pb.RerankResponse:
        return await self.classification_stub.Rerank(rerank_request(query, documents, **kwargs), timeout=self.timeout)

    async def classify(self, inputs: Iterable[str | tuple[str, str]], **kwargs: Any) -> pb.ClassifyResponse:
        return await self.classification_stub.Classify(classify_request(inputs, **kwargs), timeout=self.timeout)


def _print(response) -> int:
    fields = MessageToDict(response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    text = json.dumps(fields, indent=2, ensure_ascii=False)  # every index and score, 0 included
    sys.stdout.write(text + "\n")
    return 0


def _cmd_rerank(args: argparse.Namespace, client: ClassificationClientMixin) -> int:
    return _print(
        client.rerank(
            args.query,
            args.documents,
            model=args.model,
            top_n=args.top_n,
            raw_scores=args.raw_scores,
            truncate=args.truncate,
            return_documents=True,
        )
    )


def _cmd_classify(args: argparse.Namespace, client: ClassificationClientMixin) -> int:
    inputs = [(t, args.pair) if args.pair is not None else t for t in args.texts]
    return _print(client.classify(inputs, model=args.model, raw_scores=args.raw_scores, truncate=args.truncate))


def add_classification_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("rerank", help="score documents against a query, best first; prints the RerankResponse")
    p.add_argument("query")
    p.add_argument("documents", nargs="+")
    p.add_argument("--top-n", type=types.count, default=None, help="keep the best N (default: every document)")
    p.set_defaults(handler=_cmd_rerank)
    c = subparsers.add_parser("classify", help="every label's score per text, best first; prints the ClassifyResponse")
    c.add_argument("texts", nargs="+")
    c.add_argument("--pair", default=None, help="a second text read with each text (a pair input)")
    c.set_defaults(handler=_cmd_classify)
    for parser in (p, c):
        parser.add_argument("--model", default="", help="model name (default: the server's default)")
        parser.add_argument("--raw-scores", action="store_true", help="the logits instead of the model's activation")
        parser.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=None)
