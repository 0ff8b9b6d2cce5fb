"""bench.gpu on a machine without a GPU: it says so and exits 0, writing nothing; its pieces that
need no GPU (the server CPU clock, the token comparisons of the report) work on the CPU.

The whole script runs on the CPU with `python -m bench.gpu --device cpu --small --out DIR` (a
few minutes on 2 cores: a manual smoke check, not part of the suite).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import onnxruntime as ort
import pytest

from bench.gpu_report import _agreement
from bench.gpu_service import ServerClock
from tests.paths import ROOT

no_gpu = pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(),
    reason="this machine has onnxruntime-gpu: bench.gpu would measure",
)


@no_gpu
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "no GPU to measure here" in proc.stdout and "nothing measured" in proc.stdout
    assert not list(tmp_path.iterdir())  # no report


def test_a_cpu_run_refuses_to_write_the_gpu_report():
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "writes no GPU report" in proc.stderr


def test_server_clock_counts_a_child_process_cpu_time():
    busy = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {busy!r}])"],
        start_new_session=True,
    )
    try:
        clock = ServerClock(parent.pid)
        deadline = time.monotonic() + 30
        while clock.seconds() < 0.45 and time.monotonic() < deadline:  # the grandchild burns 0.5 s of CPU
            time.sleep(0.1)
        assert 0.45 <= clock.seconds() < 5
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the group started here: parent and grandchild
        parent.wait()


def test_token_agreement_ignores_a_trailing_eos_and_counts_the_shared_prefix():
    eos = 0
    got = [[5, 6, 7, 0], [5, 6, 9, 9], [1, 2]]
    ref = [[5, 6, 7], [5, 6, 7, 8], [1, 2, 0]]
    figures = _agreement(got, ref, eos)
    assert figures["identical"] == 2 and figures["of"] == 3
    assert figures["mean_prefix_share"] == pytest.approx((1 + 0.5 + 1) / 3, abs=1e-4)
