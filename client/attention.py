"""The client side of InspectionService: `attention_request` and the CLI command

    python -m client attention TEXT [--model M] [--target T] [--layers 0,1] [--heads 3]
                                    (--out FILE.html | --out FILE.png | --json)

`.html` writes one self-contained page, `.png` the layer x head grid (client/figures.py,
matplotlib: the `viz` extra, imported only here); `--json` prints the AttentionResponse.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from client import args as types
from service.proto import inference_pb2 as pb


def attention_request(text: str, model: str = "", target: str = "", layers=(), heads=()) -> pb.AttentionRequest:
    return pb.AttentionRequest(text=text, model=model, target=target, layers=list(layers), heads=list(heads))


def _cmd_attention(args: argparse.Namespace, client) -> int:
    if not args.json and Path(args.out).suffix not in (".html", ".htm", ".png"):
        types.fail("attention: pass --out FILE.html, --out FILE.png or --json")
    request = attention_request(args.text, args.model, args.target, args.layers, args.heads)
    response = client.inspection_stub.Attention(request, timeout=client.timeout)
    if args.json:
        data = MessageToDict(response, preserving_proto_field_name=True)
        sys.stdout.write(json.dumps(data, ensure_ascii=False) + "\n")
    if args.out:
        try:
            from client import figures  # matplotlib: only when a picture is asked for
        except ImportError as e:
            types.fail(f"attention --out needs matplotlib ({e}): pip install 'transformer-serving[viz]'")

        out = Path(args.out)
        if out.suffix == ".png":
            out.write_bytes(figures.grid_png(response))
        else:
            out.write_text(figures.html_page(response), encoding="utf-8")
        sys.stderr.write(f"wrote {out} ({len(response.maps)} maps)\n")
    return 0


def add_attention_parser(sub) -> None:
    p = sub.add_parser("attention", help="attention maps per layer and head, as an HTML page, a PNG grid or JSON")
    p.add_argument("text", help="the input (a translator's source)")
    p.add_argument("--model", default="", help="model name (default: the default embedding model)")
    p.add_argument("--target", default="", help="translator: the target text (default: its greedy translation)")
    p.add_argument("--layers", type=types.indices, default=[], help="comma-separated layer indices (default: all)")
    p.add_argument("--heads", type=types.indices, default=[], help="comma-separated head indices (default: all)")
    p.add_argument("--out", default="", help="FILE.html (a self-contained page) or FILE.png (the grid)")
    p.add_argument("--json", action="store_true", help="print the AttentionResponse as JSON")
    p.set_defaults(handler=_cmd_attention)
