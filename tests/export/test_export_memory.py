"""The export CLI's malloc on transparent huge pages (export/memory.py `huge_pages_env`)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from export import memory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def glibc(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))


def thp(tmp_path: Path, mode: str) -> Path:
    modes = ["always", "madvise", "never"]
    path = tmp_path / "enabled"
    path.write_text(" ".join(f"[{m}]" if m == mode else m for m in modes) + "\n")
    return path


def test_asked_for_where_the_kernel_grants_huge_pages_on_request(tmp_path, glibc):
    env = memory.huge_pages_env({"HOME": "/root"}, thp(tmp_path, "madvise"))
    assert env == {"HOME": "/root", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    # the caller's other tunables are kept
    env = memory.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, thp(tmp_path, "madvise"))
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}


@pytest.mark.parametrize("mode", ["always", "never"])
def test_not_where_asking_changes_nothing(tmp_path, glibc, mode):
    assert memory.huge_pages_env({}, thp(tmp_path, mode)) is None


def test_the_callers_word_stands(tmp_path, glibc):
    for said in ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=1", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"):
        assert memory.huge_pages_env({"GLIBC_TUNABLES": said}, thp(tmp_path, "madvise")) is None


@pytest.mark.parametrize("libc", [("glibc", "2.31"), ("", ""), ("musl", "1.2")])
def test_not_without_a_glibc_that_knows_the_tunable(tmp_path, monkeypatch, libc):
    monkeypatch.setattr(platform, "libc_ver", lambda: libc)
    assert memory.huge_pages_env({}, thp(tmp_path, "madvise")) is None
    assert memory.huge_pages_env({}, tmp_path / "no-such-file") is None


def _starts(tmp_path: Path, tunables: str | None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python -m export` (no command: its usage, exit 2), each process start's GLIBC_TUNABLES
    written down by a sitecustomize on PYTHONPATH."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    log = tmp_path / "starts.txt"
    log.unlink(missing_ok=True)
    (hook / "sitecustomize.py").write_text(
        f"import os\nwith open({str(log)!r}, 'a') as f:\n    f.write(os.environ.get('GLIBC_TUNABLES', '-') + '\\n')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(ROOT)])
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    done = subprocess.run([sys.executable, "-m", "export"], env=env, cwd=ROOT, capture_output=True, text=True)
    return done, log.read_text().splitlines()


def test_the_cli_runs_again_on_huge_pages_once(tmp_path):
    if memory.huge_pages_env({}) is None:
        pytest.skip("this machine's kernel or C library gives nothing to ask for")
    done, starts = _starts(tmp_path, None)
    assert done.returncode == 2 and done.stdout.count("python -m export <command>") == 1, done
    assert starts == ["-", "glibc.malloc.hugetlb=1"]
    done, starts = _starts(tmp_path, "glibc.malloc.hugetlb=0")  # the opt-out: one start, as it was
    assert done.returncode == 2 and starts == ["glibc.malloc.hugetlb=0"]
