"""Writes model directories (the `service.manifest.Manifest` contract) and tells whether one is current.

A directory is assembled in a staging folder beside its destination, verified with the same
torch-free loader the service uses (`load_model_dir`), then moved into place with renames, so a
reader never sees a half-written directory and a failed export leaves the old one untouched.

Each manifest records in `extra.source_sha256` a hash of everything the export depends on (the
export sources, the manifest module, the library versions and the input weights); `is_current`
compares it so `python -m export models` can skip directories that are already up to date.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import onnxruntime
import torch

from export.onnx_export import OPSET
from service.manifest import GraphSpec, Manifest, ModelDir, ModelDirError, TensorSpec, load_model_dir, sha256_file

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
# The files whose content decides what an export writes (model code, exporter, gate, contract).
SOURCE_FILES = (
    "export/layers.py",
    "export/encoder.py",
    "export/decoder.py",
    "export/seq2seq.py",
    "export/checkpoint.py",
    "export/onnx_export.py",
    "export/parity.py",
    "export/modeldir.py",
    "export/minilm.py",
    "export/tiny.py",
    "export/build.py",
    "export/gpu_gate.py",
    "export/attention.py",
    "export/mlm.py",
    "export/fill_mask.py",
    "service/manifest.py",
    "service/generation/chat_template.py",  # the conversion checks its rendering against transformers
    "export/heldout.py",
    "export/packed.py",
    "service/engine/packing.py",
    "service/translation/encoder.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "export" / "convert").glob("*.py")),  # converters
)
TOKENIZER_FILE = "tokenizer.json"


@dataclass
class GraphFile:
    """One exported graph in the staging folder, with its tensor specs and gate figures."""

    role: str
    variant: str
    path: Path
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    parity: dict[str, Any] = field(default_factory=dict)


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def source_hash(inputs: list[Path] = (), salt: str = "") -> str:
    """sha256 over the export sources, library versions, the given input files (weights) and a salt."""
    h = hashlib.sha256()
    for rel in SOURCE_FILES:
        path = ROOT / rel
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<missing>") + b"\0")
    h.update(repr(sorted(versions().items())).encode())
    for path in inputs:
        h.update(Path(path).name.encode() + b"\0" + sha256_file(Path(path)).encode())
    h.update(salt.encode())
    return h.hexdigest()


def is_current(out: Path, expected_hash: str) -> bool:
    """True when out is a valid model directory exported from exactly these sources and inputs."""
    try:
        found = load_model_dir(out).manifest.extra.get("source_sha256")
    except ModelDirError as e:
        log.info("%s needs a rebuild: %s", out, e)
        return False
    return found == expected_hash


def staging_dir(out: Path) -> Path:
    """A fresh empty folder beside out (same filesystem, so the final rename is atomic)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a server running as another user must read it
    return staging


def write_manifest(staging: Path, *, graphs: list[GraphFile], **fields: Any) -> Manifest:
    """Hash the staged graphs and tokenizer, write model.json into staging and verify the folder.

    fields: the Manifest fields other than graphs, tokenizer, opset and versions (name, kind,
    architecture, special_tokens, max_input_tokens, parity, pooling, embedding_dim, ...).
    """
    specs = []
    for g in graphs:
        if g.path.parent.resolve() != staging.resolve():
            raise ValueError(f"graph {g.path} is not inside the staging folder {staging}")
        specs.append(
            GraphSpec(
                role=g.role,
                variant=g.variant,
                file=g.path.name,
                sha256=sha256_file(g.path),
                inputs=g.inputs,
                outputs=g.outputs,
                parity=g.parity,
            )
        )
    tokenizer = {
        "file": TOKENIZER_FILE,
        "sha256": sha256_file(staging / TOKENIZER_FILE),
        "type": "huggingface-tokenizers",
    }
    manifest = Manifest(graphs=specs, tokenizer=tokenizer, opset=OPSET, versions=versions(), **fields)
    (staging / "model.json").write_text(manifest.to_json(), encoding="utf-8")
    load_model_dir(staging)  # the service's own check, before anything is moved into place
    return manifest


def publish(staging: Path, out: Path) -> ModelDir:
    """Move a verified staging folder to out, replacing a previous directory."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    log.info("wrote model directory %s", out)
    return load_model_dir(out)


def file_sizes(model_dir: ModelDir) -> dict[str, int]:
    return {g.file: model_dir.file(g.file).stat().st_size for g in model_dir.manifest.graphs}
