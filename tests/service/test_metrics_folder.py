"""The supervisor's aggregate of its workers' prometheus files: a file created but not yet sized (a
worker starting, or killed while starting) is skipped, the other workers' series are served."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.metrics_dir import FolderCollector

WORKER = """
from prometheus_client import Counter
Counter("ts_test_calls", "calls", ["model"]).labels("m").inc(3)
"""


def _worker_writes(folder: Path) -> None:
    """A real process writes a counter the way a worker does (prometheus_client's multiprocess files)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    subprocess.run([sys.executable, "-c", WORKER], env=env, check=True)


def _scrape(folder: Path) -> dict[str, float]:
    registry = CollectorRegistry()
    FolderCollector(registry, path=str(folder))
    text = generate_latest(registry).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_file_not_yet_sized_is_skipped_and_the_rest_served(tmp_path):
    _worker_writes(tmp_path)
    _worker_writes(tmp_path)
    (tmp_path / "counter_4194304.db").touch()  # created, not yet sized: a worker killed while starting
    assert _scrape(tmp_path)["ts_test_calls_total"] == 6.0


def test_a_corrupt_file_still_fails_the_scrape(tmp_path):
    _worker_writes(tmp_path)
    (tmp_path / "counter_4194305.db").write_bytes(b"\xff\xff\xff\x7f" + b"\0" * 60)  # claims 2 GiB used
    with pytest.raises(Exception):  # noqa: B017 - prometheus_client raises RuntimeError or struct.error
        _scrape(tmp_path)
