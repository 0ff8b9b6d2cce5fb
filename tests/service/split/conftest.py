"""Fixtures of the `--frontends` tests: a group of engine cores (one, or `--engines 2`) and two front
ends, and one process over the same models for parity (real processes, port 0, their addresses read
from their logs)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import grpc
import pytest

from tests.fixtures.process import ServiceProcess
from tests.service.test_service_fuzz import CHAT_TEMPLATE  # tiny-gpt chats with it: short, as its context is

READY = r"{engines} and {n} front ends serving on (\S+)"


class SplitGroup(ServiceProcess):
    """`python -m service --frontends N --engines E`: ready once the supervisor says the engines and
    every front end serve. Process indices: 0..E-1 the engines, E..E+N-1 the front ends."""

    def __init__(self, models_root: Path, frontends: int = 2, *flags: str, engines: int = 1):
        cores = "engine core" if engines == 1 else f"{engines} engine cores"
        flags = ("--frontends", str(frontends), "--engines", str(engines), *flags)
        super().__init__(models_root, *flags, ready=READY.format(engines=cores, n=frontends))
        self.engines = list(range(engines))
        self.frontends = list(range(engines, engines + frontends))

    def pid(self, index: int) -> int:
        """The pid of process `index` (an engine or a front end), the latest started."""
        found = [m for line in self.log if (m := re.search(rf"worker {index} ready \(pid (\d+)\)", line))]
        return int(found[-1][1])


def own_channel(address: str) -> grpc.Channel:
    """A channel with its own TCP connection: the kernel picks a front end per connection."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def stop(process: ServiceProcess) -> None:
    process.proc.send_signal(signal.SIGTERM)
    try:
        process.wait()
    finally:
        process.kill()


@pytest.fixture(scope="module")
def chat_template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chat") / "template.jinja"
    path.write_text(CHAT_TEMPLATE)
    return path
