"""Generates the protobuf / gRPC stubs in service/proto/ from protos/ (`make protos`).

The stubs are checked in so a fresh clone serves without a build step; a test regenerates them
into a temporary folder and fails if the checked-in copies are stale. grpc_tools writes absolute
imports (`from inference.v1 import ...`); they are rewritten to the package's own path.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_FILES = ["inference/v1/inference.proto"]
OUT = ROOT / "service" / "proto"


def generate(out_dir: Path = OUT) -> list[Path]:
    """Runs protoc into out_dir; returns the files written."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"]
        if protoc.main(args + [str(PROTO_ROOT / p) for p in PROTO_FILES]) != 0:
            raise RuntimeError("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for f in sorted(Path(tmp, "inference", "v1").iterdir()):
            text = f.read_text().replace("from inference.v1 import", "from service.proto import")
            (out_dir / f.name).write_text(text)
            written.append(out_dir / f.name)
        return written


if __name__ == "__main__":
    for path in generate():
        sys.stdout.write(f"wrote {path.relative_to(ROOT)}\n")
