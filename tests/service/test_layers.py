"""service/ is layered: server -> doors (grpc, http, kserve) -> cores -> kinds -> engine and runtime.
Read from the code's own imports: its packages (and top-level modules) import each other in no loop,
and below the doors nothing imports a door, the server or protobuf (cores and kinds never see it)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter

from tests.paths import ROOT

SERVICE = ROOT / "service"
DOORS = {"service/grpc/", "service/http/", "service/kserve/", "service/server.py"}
BELOW_DOORS = (
    "service/cores.py",
    "service/models.py",
    "service/registry.py",
    "service/core.py",
    "service/timings.py",
    "service/numbers.py",
    "service/embedding/",
    "service/fillmask/",
    "service/sparse/",
    "service/generation/",
    "service/translation/",
    "service/inspection/",
    "service/engine/",
)


def part(module: str) -> str | None:
    """service.x.y -> its package "service/x/" or its module "service/x.py"; None outside service."""
    names = module.split(".")
    if names[0] != "service" or len(names) < 2:
        return None
    return f"service/{names[1]}/" if (SERVICE / names[1]).is_dir() else f"service/{names[1]}.py"


def imports() -> dict[str, set[str]]:
    """part -> the parts it imports (generated stubs as "service/proto/")."""
    graph: dict[str, set[str]] = {}
    for path in SERVICE.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if relative.parts[1] == "proto":
            continue
        source = part(".".join(relative.with_suffix("").parts))
        assert source is not None
        found = graph.setdefault(source, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            found |= {p for p in map(part, modules) if p is not None and p != source}
    return graph


def test_service_parts_import_each_other_in_no_loop():
    graph = imports()
    assert {"service/server.py", "service/embedding/", "service/cores.py"} <= set(graph)  # the graph was read
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as e:
        raise AssertionError(f"an import loop between service's parts: {' -> '.join(e.args[1])}") from e


def test_nothing_below_the_doors_imports_a_door_or_protobuf():
    graph = imports()
    upward = {p: sorted(graph.get(p, set()) & (DOORS | {"service/proto/"})) for p in BELOW_DOORS}
    assert {p: found for p, found in upward.items() if found} == {}
    assert "service/proto/" in graph["service/grpc/"]  # what the check looks for is there to find
