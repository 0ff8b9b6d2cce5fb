"""Writes model directories (the `service.manifest.Manifest` contract) and tells whether one is current.

A directory is assembled in a staging folder beside its destination, verified with the same
torch-free loader the service uses (`load_model_dir`), then moved into place with renames, so a
reader never sees a half-written directory and a failed export leaves the old one untouched.

Each manifest records in `extra.source_sha256` a hash of everything the export depends on (the
export sources, the service modules they write to, the library versions and the input weights);
`is_current` compares it so `python -m export models` can skip directories that are already up to
date. The sources are derived from the code (`source_files`), never listed by hand: a list kept by
hand once left the quantizer out, and a changed quantizer left stale int8 graphs marked current.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import onnxruntime
import torch

from export.onnx import store
from export.onnx.graphs import OPSET
from service.manifest import GraphSpec, Manifest, ModelDir, ModelDirError, TensorSpec, load_model_dir, sha256_file

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
# The commands that write model directories; what they import decides what an export writes.
BUILD_COMMANDS = ("export.cli", "export.convert.cli")
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


def _module_file(name: str, root: Path) -> Path | None:
    """The file of a module of this repository (a.b -> a/b.py or a/b/__init__.py); None elsewhere."""
    base = root.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _imports(path: Path, name: str, root: Path) -> set[str]:
    """The modules that the file's import statements name, those inside functions included (lazy
    imports run in a build too); `from a import b` names a.b where that is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parents = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join([*parents, *([node.module] if node.module else [])])
            names.update(f"{base}.{a.name}" if _module_file(f"{base}.{a.name}", root) else base for a in node.names)
    return names


@functools.cache
def source_files(root: Path = ROOT) -> tuple[str, ...]:
    """The files whose content decides what an export writes, relative to root, sorted: every
    module of `export` that BUILD_COMMANDS import at any depth (with the packages around them), and
    the modules outside `export` that those import directly (service's manifest contract and the
    packing the packed graphs are gated with), not what those import in turn."""
    seen: set[str] = set()
    outside: set[str] = set()
    todo = list(BUILD_COMMANDS)
    while todo:
        name = todo.pop()
        path = _module_file(name, root)
        if name in seen or path is None:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # a module's packages run first
        for imported in _imports(path, name, root):
            if imported.split(".")[0] == "export":
                todo.append(imported)
            elif _module_file(imported, root):
                outside.add(imported)
    files = [_module_file(name, root) for name in seen | outside]
    return tuple(sorted(str(f.relative_to(root)) for f in files if f is not None))


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def source_hash(inputs: Sequence[Path] = (), salt: str = "", root: Path = ROOT) -> str:
    """sha256 over the export sources (`source_files`), library versions, the given input files
    (weights) and a salt."""
    h = hashlib.sha256()
    for rel in source_files(root):
        path = root / rel
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
                data=_data(g.path),
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


def _data(graph: Path) -> dict[str, str]:
    """The manifest's entry for a graph's external data file (export/onnx/store.py), if it has one."""
    data = store.data_file(graph)
    return {"file": data.name, "sha256": sha256_file(data)} if data.exists() else {}


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
    """Each graph's bytes on disk, its external data file's included."""
    return {
        g.file: sum(model_dir.file(f).stat().st_size for f in (g.file, g.data.get("file")) if f)
        for g in model_dir.manifest.graphs
    }
