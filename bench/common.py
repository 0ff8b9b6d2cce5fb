"""Plumbing shared by the benchmarks: worker subprocesses, the service subprocess, summaries.

Every side of a comparison runs in its own process (`run_worker`): PyTorch and onnxruntime each
bring a thread pool, and two busy pools in one process spin against each other on a small machine,
which would handicap whichever side runs second. Workers print one JSON object as the last line of
stdout. `ServiceProcess` runs the real `python -m service`. `conditions()` records the machine and
its load next to the figures, since both move them.
"""

from __future__ import annotations

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

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]


def run_worker(module: str, *args: str, timeout: float = 900) -> dict:
    """Runs `python -m module args` from the repository root; returns its last stdout line as JSON."""
    cmd = [sys.executable, "-m", module, *args]
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


class ServiceProcess:
    """`python -m service` on free ports (gRPC, HTTP, and metrics unless disabled), until `stop()`."""

    def __init__(
        self, models: Path, flags: list[str], metrics: bool = False, keep_log: bool = False, max_files: int = 0
    ):
        """keep_log: go on collecting the server's log lines in `log` after the start (else dropped);
        max_files: the server's RLIMIT_NOFILE (0: this process's)."""
        cmd = [
            sys.executable,
            "-m",
            "service",
            "--models",
            str(models),
            "--port",
            "0",
            "--metrics-port",
            "0" if metrics else "-1",
            "--http-port",
            "0",
            *flags,
        ]
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))) if max_files else None
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
        self.address, self.metrics_url, self.http_url, self.log = "", "", "", []
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            if m := re.search(r"gRPC listening on (\S+)", line):
                self.address = m.group(1)
            if m := re.search(r"metrics on (http://\S+)", line):
                self.metrics_url = m.group(1)
            if m := re.search(r"HTTP listening on (http://\S+)", line):
                self.http_url = m.group(1)
            if "model(s) on" in line:
                drain = self._collect if keep_log else self.proc.stderr.read  # keep the pipe drained
                threading.Thread(target=drain, daemon=True).start()
                return
        raise RuntimeError("service did not start:\n" + "\n".join(self.log))

    def _collect(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


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


def snapshot_checkpoint(checkpoint: Path, out: Path) -> tuple[Path, object, dict, object, str]:
    """Copies a trained checkpoint into out/checkpoint (a training job may overwrite the original
    while the sides load it) and loads it: -> (snapshot path, model, meta, tokenizer, description)."""
    import shutil

    from tokenizers import Tokenizer

    from export.checkpoint import load_checkpoint

    snapshot = Path(shutil.copytree(checkpoint, out / "checkpoint"))
    model, meta = load_checkpoint(snapshot)
    tokenizer = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    source = f"trained checkpoint {checkpoint} ({meta.get('training', {}).get('steps')} steps)"
    return snapshot, model, meta, tokenizer, source
