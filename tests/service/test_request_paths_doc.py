"""docs/design/request-paths.md stays true: every file it names exists, and its list of the places a
new kind is named ("A new kind") is complete. Complete means: every file of service/, client/,
export/ and protos/ whose code names fill-mask, the newest kind, is on the list; comments and
docstrings do not count (a file that only mentions a kind names nothing a new kind must change)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.paths import ROOT

DOC = ROOT / "docs" / "design" / "request-paths.md"
EXTERNAL = {"handlers/dataplane.py", "grpc/servicers.py", "rest/endpoints.py"}  # MLServer's, cited
KIND = "fillmask"  # what `<kind>` stands for when the list is checked
FILL_MASK = re.compile(r"fill[-_]?mask", re.IGNORECASE)
SEARCHED = ("service", "client", "export", "protos")


def section(text: str, title: str) -> str:
    start = text.index(f"\n### {title}\n")
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else len(text)]


def listed(text: str) -> list[str]:
    """The paths that open the bullets of "A new kind" (`a`, `b`: ...), `<kind>` as fill-mask's package."""
    bullets = re.findall(r"^- ((?:`[^`]+`(?:, )?)+):", section(text, "A new kind"), re.MULTILINE)
    return [path.replace("<kind>", KIND) for bullet in bullets for path in re.findall(r"`([^`]+)`", bullet)]


def words(source: str) -> list[str]:
    """The identifiers, imported names and string constants of Python code, docstrings left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.append(node.id)
        elif isinstance(node, ast.Attribute):
            found.append(node.attr)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [getattr(node, "module", None) or "", *(alias.name for alias in node.names)]
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            found.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append(node.value)
    return found


def names_fill_mask(path: Path) -> bool:
    if path.suffix == ".proto":
        code = "\n".join(line.split("//")[0] for line in path.read_text().splitlines())
        return bool(FILL_MASK.search(code))
    return any(FILL_MASK.search(word) for word in words(path.read_text()))


def naming_files() -> set[str]:
    files = (p for top in SEARCHED for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".proto"))
    generated = ROOT / "service" / "proto"
    return {str(p.relative_to(ROOT)) for p in files if generated not in p.parents and names_fill_mask(p)}


def test_the_list_of_places_a_kind_is_named_exists_and_says_its_length():
    text = DOC.read_text()
    paths = listed(text)
    assert len(paths) == len(set(paths)) > 20
    assert [p for p in paths if not (ROOT / p).exists()] == []
    stated = re.search(r"A new kind is named in (\d+) places", text)
    assert stated and int(stated.group(1)) == len(paths)


def test_every_file_whose_code_names_a_kind_is_on_the_list():
    paths = listed(DOC.read_text())
    folders = tuple(p for p in paths if p.endswith("/"))
    missing = sorted(f for f in naming_files() if f not in paths and not f.startswith(folders))
    assert missing == [], f"name these in docs/design/request-paths.md, 'A new kind': {missing}"


def test_the_scan_sees_code_and_not_prose():
    assert names_fill_mask(ROOT / "service" / "kinds.py")  # Kind("fill-mask", ...)
    assert not any(FILL_MASK.search(w) for w in words('"""fill-mask in a docstring"""\n# fill-mask\nx = 1\n'))


def test_every_file_the_doc_names_exists():
    """Backquoted paths resolve from the root, service/ or docs/design/ (`<kind>` as fill-mask's)."""
    text = DOC.read_text()
    named = {t for t in re.findall(r"`([^`\s]+)`", text) if "/" in t and re.search(r"(\.py|\.proto|\.md|/)$", t)}
    bases = (ROOT, ROOT / "service", DOC.parent)
    dangling = sorted(
        t for t in named - EXTERNAL if not any((base / t.replace("<kind>", KIND)).exists() for base in bases)
    )
    assert dangling == []
