"""The generation models' KV-cache budget: a cache's size, and how much a process may allocate.

`plan_rows` sizes a model's cache (`cache.SlotCache`, allocated whole at load) before anything is
allocated and checks it against the process's budget (settings `gen_kv_cache_bytes`; 0: a fraction
of the free device or host memory, split between workers): all rows fit, fewer fit (a WARNING), or
none fits (`ModelLoadError` naming the bytes, the budget and the settings to change). Figures and
the auto rule: docs/design/generation.md and docs/api.md (`--gen-kv-cache-bytes`).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

from service.engine.graphio import GraphIO
from service.registry import ModelLoadError
from service.settings import Settings

log = logging.getLogger(__name__)

AUTO_FRACTION = 0.5  # of the free memory: the rest is for activations, the arena's growth, other models
MIB = 1 << 20
CUDA_RUNTIMES = ("libcudart.so.12", "libcudart.so.11.0", "libcudart.so")
CGROUP = Path("/sys/fs/cgroup")
HINT = (
    "raise gen_kv_cache_bytes (TS_GEN_KV_CACHE_BYTES, --gen-kv-cache-bytes) or lower gen_max_context "
    "(TS_GEN_MAX_CONTEXT, --gen-max-context)"
)


def kv_bytes(io: GraphIO, rows: int, context: int) -> int:
    """Bytes of a cache: key and value of every layer, each (rows, H, context, D) of the KV dtype."""
    return len(io.past_names) * rows * io.n_heads * context * io.head_dim * np.dtype(io.kv_dtype).itemsize


def mib(n: int | None) -> str:
    if n is None:
        return "unbounded"
    return f"{n / MIB:,.1f} MiB"


def cuda_free_bytes() -> int | None:
    """Free memory of the current CUDA device, or None when no CUDA runtime library answers."""
    for name in CUDA_RUNTIMES:
        try:
            cudart = ctypes.CDLL(name)  # the one onnxruntime's CUDA provider loaded, if so named
        except OSError:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0:
            return free.value
    return None


def cpu_free_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = CGROUP) -> int | None:
    """MemAvailable, lowered to the cgroup v2 limit minus its usage where a limit is set."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        free = int(fields["MemAvailable"].split()[0]) * 1024  # "12345 kB"
    except (OSError, KeyError, ValueError):
        return None
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            free = min(free, int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(free, 0)


class KVBudget:
    """The bytes this process's generation models may still allocate for their caches (None: no limit)."""

    def __init__(self, total: int | None, source: str):
        self.total, self.source, self.spent = total, source, 0

    @classmethod
    def from_settings(cls, settings: Settings, cuda: bool) -> KVBudget:
        if settings.gen_kv_cache_bytes:
            return cls(settings.gen_kv_cache_bytes, "gen_kv_cache_bytes")
        free = cuda_free_bytes() if cuda else cpu_free_bytes()
        where = "free CUDA device memory" if cuda else "available memory"
        if free is None:
            log.warning(
                "KV-cache budget: cannot read the %s; generation caches are not limited (set gen_kv_cache_bytes)", where
            )
            return cls(None, f"auto: {where} unknown")
        workers = max(settings.workers, 1)
        per = f" / {workers} workers" if workers > 1 else ""
        return cls(int(free * AUTO_FRACTION) // workers, f"auto: {AUTO_FRACTION:.0%} of {mib(free)} {where}{per}")

    @classmethod
    def of(cls, runtime, cuda: bool) -> KVBudget:
        """The runtime's (one per process), made when the first generation model loads."""
        if runtime.kv_budget is None:
            runtime.kv_budget = cls.from_settings(runtime.settings, cuda)
        return runtime.kv_budget

    @property
    def left(self) -> int | None:
        return None if self.total is None else self.total - self.spent

    def describe(self) -> str:
        if self.total is None:
            return f"no KV budget ({self.source})"
        return f"KV budget {mib(self.left)} left of {mib(self.total)} ({self.source})"

    def plan_rows(self, name: str, io: GraphIO, wanted: int, context: int) -> int:
        """Rows of cache the model gets (<= wanted), taken from the budget; logs the size.
        Raises ModelLoadError when not one row at `context` positions fits."""
        row, left = kv_bytes(io, 1, context), self.left
        rows = wanted if left is None else min(wanted, left // row)
        if left is not None and rows < 1:
            fits = left // (row // context)  # positions one row could hold
            shorter = f"a context of at most {fits} positions fits; " if fits >= 2 else ""
            raise ModelLoadError(
                f"generation model {name!r}: one KV-cache row at its context of {context} positions needs "
                f"{mib(row)} ({row} bytes: {io.n_layers} layers x key and value x {io.n_heads} heads x "
                f"{io.head_dim} x {np.dtype(io.kv_dtype).name}), more than the KV budget of {mib(left)} "
                f"({left} bytes; {self.source}); {shorter}{HINT}"
            )
        if rows < wanted:
            log.warning(
                "generation model %s: %d rows (gen_max_batch) of KV cache at %d positions need %s, over the "
                "%s; serving %d rows instead (%s to serve more)",
                name,
                wanted,
                context,
                mib(row * wanted),
                self.describe(),
                rows,
                HINT,
            )
        self.spent += row * rows
        log.info(
            "generation model %s: KV cache %d rows x %d positions x %d layers x %d heads x %d = %s (%s; "
            "key and value), %s",
            name,
            rows,
            context,
            io.n_layers,
            io.n_heads,
            io.head_dim,
            mib(row * rows),
            np.dtype(io.kv_dtype).name,
            self.describe(),
        )
        return rows

    def give_back(self, n: int) -> None:
        self.spent -= n
