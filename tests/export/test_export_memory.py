"""The export CLI's malloc on transparent huge pages (service/memory.py `huge_pages_env`, which
`python -m export` and `python -m service` run again with)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from service import memory
from tests.fixtures.process import recorded_starts

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


def test_the_cli_runs_again_on_huge_pages_once(tmp_path):
    if memory.huge_pages_env({}) is None:
        pytest.skip("this machine's kernel or C library gives nothing to ask for")
    done, starts = recorded_starts(tmp_path, ["-m", "export"], None)
    assert done.returncode == 2 and done.stdout.count("python -m export <command>") == 1, done
    assert starts == ["-", "glibc.malloc.hugetlb=1"]
    # the opt-out: one start, as it was
    done, starts = recorded_starts(tmp_path, ["-m", "export"], "glibc.malloc.hugetlb=0")
    assert done.returncode == 2 and starts == ["glibc.malloc.hugetlb=0"]
