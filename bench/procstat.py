"""Memory and CPU time of a server process and its descendants, from /proc (Linux).

A server started with `--workers N` is a supervisor whose workers do the serving, so figures
are summed over the process tree: resident memory (VmRSS) and user + system CPU time.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces): [state, ppid, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree(pid: int) -> list[int]:
    """pid and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError):  # the process exited meanwhile
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_mb(pid: int) -> float:
    """Resident memory of the process tree in MiB."""
    total = 0
    for p in tree(pid):
        try:
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)
    return total / 1024.0


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of the process tree (live processes; utime and stime fields)."""
    total = 0
    for p in tree(pid):
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS
