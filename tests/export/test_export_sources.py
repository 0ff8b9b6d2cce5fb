"""The sources that make a model directory stale (export/modeldir.py `source_files`): derived from the
build's imports, held against the modules a real build loads, and each one's change noticed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from export.build import build_model_dir
from export.modeldir import ROOT, is_current, source_files, source_hash
from export.tiny import byte_tokenizer, special_tokens, tiny_model

LOADED = """
import json, sys
from pathlib import Path
from export.tiny import build_tiny
build_tiny("generation", Path(sys.argv[1]), ("int8",))
print(json.dumps([m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)]))
"""


def test_every_export_module_a_build_loads_is_a_source(tmp_path):
    # a fresh interpreter builds a generator with its int8 graph (the quantizer is imported only then)
    run = subprocess.run(
        [sys.executable, "-c", LOADED, str(tmp_path / "tiny-gpt")], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    files = [Path(f).resolve() for f in json.loads(run.stdout.splitlines()[-1])]
    loaded = {str(f.relative_to(ROOT)) for f in files if f.is_relative_to(ROOT / "export")}
    assert "export/onnx/quantize.py" in loaded
    assert loaded <= set(source_files()), sorted(loaded - set(source_files()))


def test_sources_follow_imports_inside_functions_and_leave_training_out():
    files = set(source_files())
    # imported inside make_int8 and inside heldout's functions: a hand-kept list once missed both
    assert {"export/onnx/quantize.py", "export/train/data.py"} <= files
    assert {"service/manifest.py", "service/engine/packing.py"} <= files  # what the export writes to
    assert "export/train/loop.py" not in files  # a change to training alone rebuilds nothing
    assert "service/server.py" not in files  # nor does one to serving


def test_a_change_to_any_source_marks_a_directory_stale(tmp_path):
    root = tmp_path / "src"
    for rel in source_files():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, root / rel)
    assert source_files(root) == source_files()
    digest = source_hash(salt="stale", root=root)
    out = tmp_path / "tiny-embed"
    tok = byte_tokenizer("embedding")
    model = tiny_model("embedding", tok.get_vocab_size())
    special = special_tokens("embedding", tok)
    build_model_dir("embedding", model, tok, out, name="e", special_tokens=special, extra={"source_sha256": digest})
    assert is_current(out, source_hash(salt="stale", root=root))
    for rel in source_files(root):
        original = (root / rel).read_bytes()
        (root / rel).write_bytes(original + b"\n# changed\n")
        assert not is_current(out, source_hash(salt="stale", root=root)), f"a change to {rel} went unnoticed"
        (root / rel).write_bytes(original)
    assert is_current(out, source_hash(salt="stale", root=root))
