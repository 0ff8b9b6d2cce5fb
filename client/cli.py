"""The command line `python -m client` (= `ts-client`): JSON out, one line per error, exit codes.

    python -m client [--address HOST:PORT] [--timeout S] [--token T --tls-ca CA ...] COMMAND ...

Commands: `embed TEXT...`, `embed-sparse TEXT...` (a SPLADE model's non-zero weights),
`fill-mask TEXT... [--top-k K] [--json]` (a table unless --json), `models [NAME]`, `health
[--service S]` (exit 0 only when SERVING), `generate` (client/generation.py), `translate`
(client/translation.py), `rerank`, `classify` (client/classification.py), `attention`
(client/attention.py), `batch` (client/batch/cli.py).
Exit codes: 0 done, 1 not SERVING, 2 a bad argument or the server's error (`error: CODE: details`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from client import args as types
from client import channel as channels
from client.attention import add_attention_parser
from client.batch.cli import add_batch_parser
from client.classification import add_classification_parsers
from client.clients import DEFAULT_ADDRESS, Client
from client.generation import add_generate_parser
from client.translation import add_translate_parser


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def _cmd_embed(args: argparse.Namespace, client: Client) -> int:
    response = client.embed_response(
        args.texts,
        model=args.model,
        normalize=args.normalize,
        truncate=args.truncate,
        dimensions=args.dimensions,
        packed=args.packed,
        prompt_name=args.prompt_name,
        prompt=args.prompt,
    )
    _print_json(MessageToDict(response, preserving_proto_field_name=True))
    return 0


def _cmd_embed_sparse(args: argparse.Namespace, client: Client) -> int:
    fields: dict[str, Any] = {"model": args.model, "prompt_name": args.prompt_name}
    if args.truncate is not None:
        fields["truncate"] = args.truncate
    response = client.embed_sparse(args.texts, **fields)
    _print_json(MessageToDict(response, preserving_proto_field_name=True))
    return 0


def _cmd_fill_mask(args: argparse.Namespace, client: Client) -> int:
    response = client.fill_mask(args.texts, model=args.model, top_k=args.top_k)
    if args.json:
        _print_json(MessageToDict(response, preserving_proto_field_name=True))
        return 0
    for text, result in zip(args.texts, response.results, strict=True):
        sys.stdout.write(f"{text}\n")
        for m, mask in enumerate(result.masks):
            for c in mask.candidates:
                sys.stdout.write(f"  mask {m}  {c.score:.4f}  {c.token!r:<16} {c.sequence}\n")
    return 0


def _cmd_models(args: argparse.Namespace, client: Client) -> int:
    if args.name:
        _print_json(MessageToDict(client.model(args.name), preserving_proto_field_name=True))
    else:
        _print_json([MessageToDict(m, preserving_proto_field_name=True) for m in client.models()])
    return 0


def _cmd_health(args: argparse.Namespace, client: Client) -> int:
    status = client.health(args.service)
    _print_json({"service": args.service, "status": status})
    return 0 if status == "SERVING" else 1


def build_parser() -> argparse.ArgumentParser:
    prog = "ts-client" if Path(sys.argv[0]).name == "ts-client" else "python -m client"
    parser = types.Parser(prog=prog, description="transformer-serving client")
    parser.add_argument("--address", default=DEFAULT_ADDRESS, help=f"host:port of the service ({DEFAULT_ADDRESS})")
    parser.add_argument("--timeout", type=types.seconds, default=30.0, help="deadline of the call, seconds")
    channels.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    embed = sub.add_parser("embed", help="embed texts; prints the EmbedResponse as JSON")
    embed.add_argument("texts", nargs="+")
    embed.add_argument("--model", default="", help="model name (default: the server's default)")
    embed.add_argument("--dimensions", type=types.count, default=0, help="keep the first N values (0: all)")
    embed.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None)
    embed.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=None)
    embed.add_argument("--packed", action="store_true", help="ask for packed float32 bytes (printed as base64)")
    embed.add_argument("--prompt-name", default="", help="one of the model's instruction prompts")
    embed.add_argument("--prompt", default=None, help="the prefix text itself, instead of --prompt-name")
    embed.set_defaults(handler=_cmd_embed)
    sparse = sub.add_parser("embed-sparse", help="sparse (SPLADE) embeddings; prints the EmbedSparseResponse as JSON")
    sparse.add_argument("texts", nargs="+")
    sparse.add_argument("--model", default="", help="model name (default: the server's default)")
    sparse.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=None)
    sparse.add_argument("--prompt-name", default="", help="one of the model's instruction prompts")
    sparse.set_defaults(handler=_cmd_embed_sparse)
    fill = sub.add_parser("fill-mask", help="predict the [MASK] tokens of texts; prints candidates best first")
    fill.add_argument("texts", nargs="+", help='texts holding one or more [MASK], e.g. "The cat sat on the [MASK]."')
    fill.add_argument("--model", default="", help="model name (default: the server's default)")
    fill.add_argument("--top-k", type=types.count, default=0, help="candidates per mask (0: 5)")
    fill.add_argument("--json", action="store_true", help="print the FillMaskResponse as JSON")
    fill.set_defaults(handler=_cmd_fill_mask)
    models = sub.add_parser("models", help="list the served models, or show one")
    models.add_argument("name", nargs="?", default="")
    models.set_defaults(handler=_cmd_models)
    health = sub.add_parser("health", help="health status; exit code 0 when SERVING")
    health.add_argument("--service", default="", help='e.g. inference.v1.EmbeddingService ("" = overall)')
    health.set_defaults(handler=_cmd_health)
    add_generate_parser(sub)  # each sets handler(args, client) -> int
    add_translate_parser(sub)
    add_classification_parsers(sub)
    add_batch_parser(sub)  # resumable batch embedding of a large file
    add_attention_parser(sub)  # attention maps as pictures or JSON
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        with Client(args.address, args.timeout, credentials=channels.Credentials.from_args(args)) as client:
            return args.handler(args, client)
    except grpc.RpcError as e:  # the server's status (INVALID_ARGUMENT names the field and why)
        sys.stderr.write(f"error: {e.code().name}: {e.details()}\n")
    except OSError as e:  # an unreadable --tls-* file, an unwritable --out
        sys.stderr.write(f"error: {e}\n")
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
