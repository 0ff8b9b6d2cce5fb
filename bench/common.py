"""Plumbing shared by the benchmarks: worker subprocesses, the service subprocess, summaries.

Every side of a comparison runs in its own process (`run_worker`): PyTorch and onnxruntime each
bring a thread pool, and two busy pools in one process spin against each other on a small machine,
which would handicap whichever side runs second. Workers print one JSON object as the last line of
stdout. `ServiceProcess` runs the real `python -m service`: the one launcher of it in bench/.
`conditions()` records the machine and its load next to the figures, since both move them.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar, cast

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
M = TypeVar("M")


def run_worker(module: str, *args: str, timeout: float = 900, python: str = sys.executable) -> dict:
    """Runs `python -m module args` from the repository root (python: another interpreter, e.g. a
    peer's own venv); returns its last stdout line as JSON."""
    cmd = [python, "-m", module, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def emit(result: dict) -> None:
    """A worker's answer: one JSON line on stdout."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def summary(values: list[float], digits: int = 2) -> dict:
    """Median and spread of repeated measurements (the median is the figure to quote)."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "runs": [round(v, digits) for v in values],
    }


def conditions() -> dict:
    """The machine and how loaded it is right now (load average over 1, 5, 15 minutes)."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    busy = subprocess.run(["pgrep", "-f", "export train"], capture_output=True, text=True).stdout.split()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "training_jobs_running": len(busy),
    }


class ServiceStartError(RuntimeError):
    """`python -m service` exited (or closed its log) before it served: its exit code and log lines."""

    def __init__(self, returncode: int | None, log: list[str]):
        super().__init__(f"service did not start (exit {returncode}):\n" + "\n".join(log))
        self.returncode, self.log = returncode, log


class ServiceProcess:
    """`python -m service` on free ports (gRPC; HTTP unless `http=False`; metrics if `metrics=True`),
    from the repository root, until `stop()`. The one launcher every benchmark uses.

    Returns once the server serves: after "serving N model(s)", or, with `--workers N` among the
    flags, after the supervisor's "all N workers serving" (`--frontends N`: "engine core and N front
    ends serving"). Raises ServiceStartError if it never does.
    `proc.pid` is the server (the supervisor with `--workers`; bench.procstat sums its process tree).
    """

    def __init__(
        self,
        models: Path,
        flags: list[str],
        metrics: bool = False,
        keep_log: bool = False,
        http: bool = True,
        exit_timeout: float = 60.0,
        max_files: int = 0,
    ):
        """keep_log: go on collecting the server's log lines in `log` after the start (else dropped).
        exit_timeout: seconds `stop()`, or a failed start, waits for the process to exit;
        max_files: the server's RLIMIT_NOFILE (0: this process's)."""
        cmd = [sys.executable, "-m", "service", "--models", str(models), "--port", "0"]
        cmd += ["--metrics-port", "0" if metrics else "-1", "--http-port", "0" if http else "-1", *flags]
        limit = (
            functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE, (max_files, max_files)) if max_files else None
        )
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
        self._stderr = cast(IO[str], self.proc.stderr)  # a pipe: stderr=PIPE, text=True
        self.exit_timeout = exit_timeout
        self.address, self.metrics_url, self.http_url = "", "", ""
        self.log: list[str] = []
        if not self._serving():
            self._reap()
            raise ServiceStartError(self.proc.returncode, self.log)
        drain = self._collect if keep_log else self._stderr.read  # keep the pipe drained
        threading.Thread(target=drain, daemon=True).start()

    def _serving(self) -> bool:
        """Reads the log until the server serves (True) or its stderr closes (False)."""
        ready = "model(s) on"
        for line in self._stderr:
            self.log.append(line.rstrip())
            if m := re.search(r"gRPC listening on (\S+)(?: \((\d+) (workers|front ends))?", line):
                self.address = self.address or m.group(1)
                if m.group(2):
                    ready = f"all {m.group(2)} workers serving on"
                    if m.group(3) == "front ends":
                        ready = f"engine core and {m.group(2)} front ends serving on"
            if m := re.search(r"metrics on (http://\S+)", line):
                self.metrics_url = self.metrics_url or m.group(1)
            if m := re.search(r"HTTP listening on (http://\S+)", line):
                self.http_url = self.http_url or m.group(1)
            if ready in line:
                return True
        return False

    def _collect(self) -> None:
        for line in self._stderr:
            self.log.append(line.rstrip())

    def _reap(self) -> None:
        try:
            self.proc.wait(self.exit_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(self.exit_timeout)


def scrape_histogram(url: str, name: str) -> dict[str, float]:
    """One histogram of a /metrics page, summed over labels: {"count", "sum", "le=<bound>"...}."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                key = f"le={sample.labels['le']}"
            elif sample.name.endswith(("_count", "_sum")):
                key = sample.name.rsplit("_", 1)[1]
            else:
                continue
            out[key] = out.get(key, 0.0) + sample.value
    return out


def histogram_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """What a histogram observed between two scrapes: count, mean and the per-bucket counts."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    count = delta.get("count", 0.0)
    buckets, below = {}, 0.0
    for key in sorted((k for k in delta if k.startswith("le=")), key=lambda k: float(k[3:])):
        buckets[key[3:]] = int(delta[key] - below)  # cumulative -> per bucket
        below = delta[key]
    return {
        "count": int(count),
        "mean": round(delta.get("sum", 0.0) / count, 2) if count else None,
        "per_bucket": {k: v for k, v in buckets.items() if v},
    }


def served_quality(model_dir: Path, variant: str) -> dict | None:
    """The export gate's teacher-forced quality figures of the variant the engine served (None for
    exact variants, which the gate holds to PyTorch's tokens instead)."""
    from service.manifest import load_model_dir

    figures = load_model_dir(model_dir).manifest.graph("decoder", variant).parity
    return {**figures["quality"], "quality_ok": figures["quality_ok"]} if "quality" in figures else None


def snapshot_checkpoint(checkpoint: Path, out: Path, expect: type[M]) -> tuple[Path, M, dict, Tokenizer, str]:
    """Copies a trained checkpoint into out/checkpoint (a training job may overwrite the original
    while the sides load it) and loads it, a model of class `expect`:
    -> (snapshot path, model, meta, tokenizer, description)."""
    import shutil

    from tokenizers import Tokenizer

    from export.train.checkpoint import load_checkpoint

    snapshot = Path(shutil.copytree(checkpoint, out / "checkpoint"))
    model, meta = load_checkpoint(snapshot)
    if not isinstance(model, expect):
        raise ValueError(f"{checkpoint} holds a {meta['architecture']} checkpoint, not a {expect.__name__}")
    tokenizer = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    source = f"trained checkpoint {checkpoint} ({meta.get('training', {}).get('steps')} steps)"
    return snapshot, model, meta, tokenizer, source
