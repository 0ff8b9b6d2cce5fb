"""A real Prometheus (Debian's `prometheus`) scrapes a real running service and loads the alert
rules; its query API returns the request counter the service exported.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request

import pytest

from service.proto import inference_pb2 as pb
from tests.deploy.tools import DEPLOY, tool

pytestmark = pytest.mark.deploy
CALLS = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


async def poll(fn, timeout: float, what: str):
    """Calls fn (blocking) in a thread until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            value = await asyncio.to_thread(fn)
        except OSError:  # not listening yet
            value = None
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


def write_config(tmp_path, metrics_port: int) -> None:
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [alerts.yml]\n"
        "scrape_configs:\n"
        "  - job_name: transformer-serving\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )


@pytest.mark.timeout(180)
async def test_prometheus_scrapes_the_request_counter(start_server, embed_models_root, tmp_path):
    prometheus = tool("prometheus", "apt-get install -y --no-install-recommends prometheus")
    running = await start_server(embed_models_root)
    for i in range(CALLS):
        await running.embedding.Embed(pb.EmbedRequest(inputs=[f"scrape me {i}"]))
    write_config(tmp_path, running.metrics_port)
    port = free_port()
    (tmp_path / "data").mkdir()
    with open(tmp_path / "prometheus.log", "w") as log:  # the child keeps its own copy of the file
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        query = 'sum(ts_requests_total{service="EmbeddingService",method="Embed",code="OK"})'
        result = await poll(lambda: api(port, "query", query=query)["data"]["result"], 60, "the first sample")
        assert float(result[0]["value"][1]) == CALLS
        info = await poll(lambda: api(port, "query", query="ts_model_info")["data"]["result"], 30, "ts_model_info")
        assert info[0]["metric"]["model"] == "tiny-embed" and info[0]["metric"]["provider"] == "CPUExecutionProvider"
        groups = (await asyncio.to_thread(api, port, "rules"))["data"]["groups"]
        alerts = {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
        assert "TransformerServingHighErrorRate" in alerts and "TransformerServingCPUFallback" in alerts
        assert all(r["health"] != "err" for g in groups for r in g["rules"])
        up = await poll(lambda: api(port, "query", query="up")["data"]["result"], 30, "up")
        assert up[0]["value"][1] == "1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
