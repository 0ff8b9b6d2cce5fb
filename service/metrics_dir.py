"""The `--workers` supervisor's prometheus multiprocess folder: one per run, gone after it.

`own_metrics_dir()` makes a fresh `ts-metrics-*` folder in the temporary directory and removes it
when the run ends. A supervisor that is killed (SIGKILL, out of memory) cannot remove it, so each
folder holds a LOCK file that its supervisor keeps locked (`flock`) while it runs; the kernel drops
the lock when the process dies, and every start removes the folders whose lock it can take (their
supervisor is gone). A folder without a lock file (being made right now, or by an older version)
is removed once it is an hour old.

`FolderCollector` aggregates the folder on a scrape. prometheus_client creates a worker's file and
sizes it a moment later; a scrape in that moment read an empty file, failed, and answered 500 with
every series, and a worker killed in that moment (restarted workers write their first samples
while the test kills them) left the empty file for the rest of the run: every scrape after failed
(prometheus/client_python#1199). An empty file has nothing recorded and is skipped; any other
unreadable file still fails the scrape (a silently smaller sum would be a wrong count).
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)

PREFIX = "ts-metrics-"
LOCK = "LOCK"
UNLOCKED_MAX_AGE_S = 3600.0


@contextmanager
def own_metrics_dir(root: Path | None = None) -> Iterator[Path]:
    """A fresh folder under root (the temporary directory), locked while the block runs, then removed."""
    root = Path(root or tempfile.gettempdir())
    remove_orphans(root)
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
    with open(path / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def remove_orphans(root: Path) -> None:
    """Removes the folders of supervisors that are gone."""
    for folder in root.glob(PREFIX + "*"):
        try:
            with open(folder / LOCK) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                orphan = True
        except BlockingIOError:
            orphan = False  # a live supervisor holds it
        except FileNotFoundError:
            orphan = _age(folder) > UNLOCKED_MAX_AGE_S
        except OSError:
            continue  # not ours to judge (permissions, not a folder)
        if orphan:
            log.info("removing %s, left by a supervisor that is gone", folder)
            shutil.rmtree(folder, ignore_errors=True)


def _age(folder: Path) -> float:
    try:
        return time.time() - folder.stat().st_mtime
    except OSError:
        return 0.0


class FolderCollector(MultiProcessCollector):
    """MultiProcessCollector over one folder that skips a file created but not yet sized (module doc)."""

    def collect(self):
        return self.merge([f for f in glob.glob(os.path.join(self._path, "*.db")) if _sized(f)], accumulate=True)


def _sized(file: str) -> bool:
    try:
        return os.path.getsize(file) > 0
    except FileNotFoundError:  # a live gauge's file removed by mark_process_dead since the glob
        return False
