"""The client package shares only the contract (the generated stubs `service.proto`) with the server,
and the server never imports the client. The one exception is client/batch/local.py, the Ray
engine's in-process embedder, which runs the service's own embedding code on purpose."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT

IN_PROCESS_ENGINE = ROOT / "client" / "batch" / "local.py"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from service import x`
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def test_client_modules_import_nothing_of_the_server_but_its_stubs():
    files = sorted((ROOT / "client").rglob("*.py"))
    assert len(files) > 10 and IN_PROCESS_ENGINE in files
    bad = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        if path != IN_PROCESS_ENGINE
        for name in imported_modules(path)
        if top(name) == "service" and name != "service" and not name.startswith("service.proto")
    }
    assert not bad


def test_the_server_and_the_exporter_never_import_the_client():
    files = sorted((ROOT / "service").rglob("*.py")) + sorted((ROOT / "export").rglob("*.py"))
    assert len(files) > 20
    bad = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in imported_modules(path)
        if top(name) == "client"
    }
    assert not bad


def test_importing_the_client_loads_only_the_stubs():
    code = (
        "import sys, client, client.cli, client.batch.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('service', 'onnxruntime', 'tokenizers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(
        ["service", "service.proto", "service.proto.inference_pb2", "service.proto.inference_pb2_grpc"]
    )
