"""The project's Dockerfile built unchanged by a real Docker engine and run: gRPC health SERVING,
an Embed call through a port published on 127.0.0.1, metrics, the image's own HEALTHCHECK, no
torch in the runtime image, a non-root user, and `docker stop` ending in exit code 0 (the server
handled SIGTERM as PID 1 and drained; a SIGKILL after the timeout would give 137).

No registry is reachable here: the base image is a local stand-in built by
deploy/scripts/build-base-image.sh, and CPU torch comes from a local wheel (docs/deploy.md).
"""

from __future__ import annotations

import glob
import logging
import os
import time
import urllib.request

import numpy as np
import pytest

from client import Client
from tests.deploy.tools import DEPLOY, docker, run, tool

pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.timeout(3600)]
log = logging.getLogger(__name__)

IMAGE = "transformer-serving:test-cpu"
BASE = "python:3.11-slim"


def local_torch_wheel() -> str | None:
    """A CPU torch wheel from pip's find-links folders (PIP_FIND_LINKS), if there is one."""
    for folder in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split():
        found = sorted(glob.glob(os.path.join(folder.removeprefix("file://"), "torch-*+cpu-*.whl")))
        if found:
            return found[-1]
    return None


def build_args() -> list[str]:
    """Where the PyTorch CPU index is out of reach, the local wheel goes in through deploy/wheels/."""
    wheel = local_torch_wheel()
    return ["--torch-wheel", wheel] if wheel else []


@pytest.fixture(scope="module")
def image() -> tuple[str, dict[str, str]]:
    cli, env = docker()
    env = {**env, "DOCKER": cli}
    if run([cli, "image", "inspect", BASE], env=env).returncode != 0:
        tool("debootstrap", "apt-get install -y debootstrap")
        result = run(["bash", str(DEPLOY / "scripts" / "build-base-image.sh"), BASE], timeout=900, env=env)
        assert result.returncode == 0, result.stderr
    script = DEPLOY / "scripts" / "build-image.sh"
    result = run(["nice", "-n", "10", "bash", str(script), "cpu", "--tag", IMAGE, *build_args()], timeout=3600, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    size = run([cli, "image", "inspect", "-f", "{{.Size}}", IMAGE], env=env).stdout.strip()
    log.warning("image %s: %.0f MB", IMAGE, int(size) / 1e6)
    return cli, env


def test_runtime_image_has_no_torch_but_serves(image):
    cli, env = image
    no_torch = run([cli, "run", "--rm", "--entrypoint", "python", IMAGE, "-c", "import torch"], env=env)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    check = "import onnxruntime, service.server, client.batch.cli; print(onnxruntime.get_available_providers())"
    ok = run([cli, "run", "--rm", "--entrypoint", "python", IMAGE, "-c", check], env=env)
    assert ok.returncode == 0 and "CPUExecutionProvider" in ok.stdout, ok.stderr
    user = run([cli, "run", "--rm", "--entrypoint", "id", IMAGE, "-u"], env=env)
    assert user.stdout.strip() == "10001"
    models = run([cli, "run", "--rm", "--entrypoint", "ls", IMAGE, "/models"], env=env)
    assert models.returncode == 0 and models.stdout.split(), "no model directories in /models"


def published(cli: str, env: dict, container: str, port: int) -> str:
    out = run([cli, "port", container, f"{port}/tcp"], env=env).stdout.split()
    (address,) = [a for a in out if a.startswith("127.0.0.1:")]
    return address


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def health(address: str) -> str:
    try:
        with Client(address, timeout=3) as client:
            return client.health()
    except Exception:  # not up yet: connection refused / UNAVAILABLE
        return ""


def test_container_serves_embeddings_and_stops_cleanly(image):
    cli, env = image
    started = run(
        [
            cli,
            "run",
            "-d",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "--cap-drop",
            "ALL",
            "-e",
            "TS_COMPUTE_WORKERS=1",
            "-e",
            "TS_GRACE_SECONDS=5",
            "-p",
            "127.0.0.1::50051",
            "-p",
            "127.0.0.1::9464",
            IMAGE,
        ],
        env=env,
    )
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        grpc_address = published(cli, env, container, 50051)
        wait_until(lambda: health(grpc_address) == "SERVING", 600, "health SERVING")
        with Client(grpc_address, timeout=30) as client:
            (vector,) = client.embed(["A container on 127.0.0.1 answers."])
            models = client.models()
        (default,) = [m for m in models if m.kind == "embedding" and m.is_default]
        assert len(vector) == default.embedding_dimension and default.execution_provider == "CPUExecutionProvider"
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-3
        metrics_url = f"http://{published(cli, env, container, 9464)}/metrics"
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            body = response.read().decode()
        embed_ok = [
            line
            for line in body.splitlines()
            if line.startswith("ts_requests_total{") and 'method="Embed"' in line and 'code="OK"' in line
        ]
        assert embed_ok and float(embed_ok[0].split()[-1]) == 1.0
        status = "{{.State.Health.Status}}"
        wait_until(
            lambda: run([cli, "inspect", "-f", status, container], env=env).stdout.strip() == "healthy",
            120,
            "the image's HEALTHCHECK to report healthy",
        )
        stop = run([cli, "stop", "-t", "30", container], env=env, timeout=60)
        assert stop.returncode == 0, stop.stderr
        exit_code = run([cli, "inspect", "-f", "{{.State.ExitCode}}", container], env=env).stdout.strip()
        logs = run([cli, "logs", container], env=env)
        assert exit_code == "0", f"exit code {exit_code} (137 = killed after the timeout)\n{logs.stderr[-3000:]}"
    finally:
        run([cli, "rm", "-f", container], env=env)
