"""The pictures and head-statistics summary of docs/attention.md, from a running server.

    python -m bench.attention_figures --address 127.0.0.1:50051 --out docs/attention

Asks InspectionService.Attention for MiniLM on "The animal didn't cross the street because it was
too tired", the generator on a story opening and the translator on a sentence pair; writes each
grid (and the translator's alignment) as PNG and prints, per kind, the spread of each statistic
over the heads and its mean per layer, and the heads where "it" attends mostly to "animal".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from client import DEFAULT_ADDRESS, Client, attention_request, figures
from service.proto import inference_pb2 as pb

CASES = {
    "minilm": attention_request("The animal didn't cross the street because it was too tired", "all-minilm-l6-v2"),
    "generator": attention_request(
        "Once upon a time, there was a little girl named Lily. She loved to play", "tinystories-gpt"
    ),
    "translator": attention_request(
        "The cat is sleeping on the chair.", "tatoeba-en-fr", target="Le chat dort sur la chaise."
    ),
}


def summary(response: pb.AttentionResponse) -> list[str]:
    lines = [
        (
            f"{response.model}: {len(response.maps)} maps; source {list(response.source_tokens)}; "
            f"target {list(response.target_tokens)}"
        )
    ]
    for kind in sorted({m.kind for m in response.maps}):
        maps = [m for m in response.maps if m.kind == kind]
        for stat in figures.STATS:
            values = np.array([getattr(m.stats, stat) for m in maps])
            top = maps[int(values.argmax())]
            lines.append(
                f"  {pb.AttentionKind.Name(kind)} {stat}: mean {values.mean():.3f} min {values.min():.3f} "
                f"max {values.max():.3f} (L{top.layer} H{top.head})"
            )
        for layer in sorted({m.layer for m in maps}):
            means = [np.mean([getattr(m.stats, s) for m in maps if m.layer == layer]) for s in figures.STATS]
            lines.append(f"    L{layer}: " + " ".join(f"{s}={v:.2f}" for s, v in zip(figures.STATS, means)))
    return lines


def it_heads(response: pb.AttentionResponse) -> list[str]:
    """MiniLM: the heads whose row for "it" puts most of its weight on "animal"."""
    tokens = list(response.source_tokens)
    it, animal, street = tokens.index("it"), tokens.index("animal"), tokens.index("street")
    return [
        f"  'it' L{m.layer} H{m.head}: animal {w[animal]:.2f}, street {w[street]:.2f}"
        for m in response.maps
        if (w := figures.weights(m)[it]).argmax() == animal and w[animal] > 0.3
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=DEFAULT_ADDRESS)
    p.add_argument("--out", type=Path, default=Path("docs/attention"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with Client(args.address, timeout=300) as client:
        for name, request in CASES.items():
            response = client.inspection_stub.Attention(request, timeout=300)
            (args.out / f"{name}-grid.png").write_bytes(figures.grid_png(response))
            lines = summary(response)
            if response.kind == "translation":
                (args.out / f"{name}-alignment.png").write_bytes(figures.alignment_png(response))
            if name == "minilm":
                lines += it_heads(response)
            sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
