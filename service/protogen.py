"""Generates the protobuf / gRPC stubs in service/proto/ from protos/ (`make protos`).

The stubs are checked in so a fresh clone serves without a build step; a test regenerates them
into a temporary folder and fails if the checked-in copies are stale. grpc_tools writes absolute
imports (`from inference.v1 import ...`); they are rewritten to the package's own path.

The Open Inference Protocol (protos/kserve/v2, package `inference`) declares the same message
names as Triton's grpc_service.proto, which tritonclient registers in protobuf's default
descriptor pool: two files defining `inference.ServerLiveRequest` cannot share one pool. So its
stubs build their file into a private pool of their own (`_descriptor_pool.DescriptorPool()`),
and the server, tritonclient and any other client stubs all load in one process.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_FILES = ["inference/v1/inference.proto"]
PRIVATE_POOL_FILES = ["kserve/v2/open_inference_grpc.proto"]  # built into a pool of their own
OUT = ROOT / "service" / "proto"
DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


def _rewrite(text: str, package_dir: str, private_pool: bool) -> str:
    """Package-relative imports; for a private-pool file, its own pool instead of the default one."""
    text = text.replace(f"from {package_dir.replace('/', '.')} import", "from service.proto import")
    return text.replace(DEFAULT_POOL, PRIVATE_POOL) if private_pool else text


def generate(out_dir: Path = OUT) -> list[Path]:
    """Runs protoc into out_dir; returns the files written."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"]
        protos = PROTO_FILES + PRIVATE_POOL_FILES
        if protoc.main(args + [str(PROTO_ROOT / p) for p in protos]) != 0:
            raise RuntimeError("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for package_dir in sorted({str(Path(p).parent) for p in protos}):
            private = any(str(Path(p).parent) == package_dir for p in PRIVATE_POOL_FILES)
            for f in sorted(Path(tmp, package_dir).iterdir()):
                (out_dir / f.name).write_text(_rewrite(f.read_text(), package_dir, private))
                written.append(out_dir / f.name)
        return written


if __name__ == "__main__":
    for path in generate():
        sys.stdout.write(f"wrote {path.relative_to(ROOT)}\n")
