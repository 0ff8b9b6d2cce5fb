"""Deploy files checked by the real tools: hadolint, promtool (config, rules, rule unit tests),
docker compose config, and the metric names used by alerts and the Grafana dashboard.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from tests.deploy.tools import DEPLOY, ROOT, compose_binary, run, tool

PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "transformer-serving.json"


@pytest.mark.deploy
def test_hadolint_passes_on_the_dockerfile():
    result = run([tool("hadolint"), "--failure-threshold", "info", str(ROOT / "Dockerfile")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_stages_share_one_runtime_for_cpu_and_gpu():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\S+)", text, flags=re.M)
    assert ("${PYTHON_BASE}", "builder") in stages and ("${PYTHON_BASE}", "cpu-base") in stages
    assert ("${CUDA_BASE}", "gpu-base") in stages
    assert ("${VARIANT}-base", "runtime") in stages and stages[-1][1] == "runtime"  # the default target
    runtime = text.split("AS runtime", 1)[1]
    assert "torch" not in runtime.lower() and "USER 10001" in runtime
    assert re.search(r'^ENTRYPOINT \["python", "-m", "service"\]', runtime, flags=re.M)
    assert "HEALTHCHECK" in runtime and "python -m client " in runtime


@pytest.mark.deploy
def test_promtool_checks_config_and_rules():
    promtool = tool("promtool", "apt-get install -y --no-install-recommends prometheus")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"]):
        result = run([promtool, *args], cwd=PROM)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.deploy
def test_promtool_alert_unit_tests_pass():
    promtool = tool("promtool", "apt-get install -y --no-install-recommends prometheus")
    result = run([promtool, "test", "rules", "alerts_test.yml"], cwd=PROM)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROM / "alerts_test.yml").read_text()))
    defined = set(re.findall(r"- alert: (\w+)", (PROM / "alerts.yml").read_text()))
    assert defined == tested, f"alerts without a unit test: {defined - tested}"


@pytest.mark.deploy
def test_promtool_rejects_a_broken_rule(tmp_path):
    """The check above can fail: a rule with a bad expression is refused."""
    promtool = tool("promtool", "apt-get install -y --no-install-recommends prometheus")
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(ts_requests_total[5m]\n")
    assert run([promtool, "check", "rules", str(bad)]).returncode != 0


@pytest.mark.deploy
@pytest.mark.parametrize(
    "files", [["compose.yaml"], ["compose.yaml", "compose.gpu.yaml"], ["compose.yaml", "compose.secure.yaml"]]
)
def test_compose_config_is_valid(files):
    args = [a for f in files for a in ("-f", str(DEPLOY / "compose" / f))]
    result = run([compose_binary(), *args, "config", "--format", "json"])
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    serving = config["services"]["serving"]
    assert all(p["host_ip"] == "127.0.0.1" for s in config["services"].values() for p in s.get("ports", []))
    assert serving["read_only"] and serving["build"]["target"] == "runtime"
    if "compose.gpu.yaml" in files:
        assert serving["build"]["args"]["ONNXRUNTIME"] == "onnxruntime-gpu"
        assert serving["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    if "compose.secure.yaml" in files:  # every file the server reads comes in as a secret
        secrets = {f"/run/secrets/{x['source']}" for x in serving["secrets"]}
        env = serving["environment"]
        assert {env["TS_TLS_CERT"], env["TS_TLS_KEY"], env["TS_AUTH_TOKENS_FILE"], env["TS_TLS_CA"]} <= secrets


def test_compose_mounts_existing_files():
    config = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    for service in config["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / "compose" / source).exists(), f"{source} is mounted but does not exist"


def _metric_names() -> set[str]:
    """Every sample name the service can export (prometheus_client's registry after import)."""
    from prometheus_client import REGISTRY

    import service.auth  # each import registers its metrics
    import service.generation.metrics
    import service.metrics
    import service.split.load  # noqa: F401

    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names.update(family.name + s for s in suffixes)
    return names


def _referenced(text: str) -> set[str]:
    return set(re.findall(r"\b(ts_[a-z_]+)\b", text))


def test_alerts_and_dashboard_use_only_exported_metrics():
    known = _metric_names()
    alerts = yaml.safe_load((PROM / "alerts.yml").read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    panel_exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for where, texts in (("alerts.yml", exprs), ("dashboard", panel_exprs)):
        unknown = _referenced("\n".join(texts)) - known
        assert not unknown, f"{where} uses metrics the service does not export: {sorted(unknown)}"
    wanted = {
        "ts_requests_total",
        "ts_request_duration_seconds_bucket",
        "ts_queue_depth",
        "ts_batch_size_bucket",
        "ts_tokens_total",
        "ts_time_to_first_token_seconds_bucket",
    }
    assert wanted <= _referenced("\n".join(panel_exprs))


def test_grafana_provisioning_points_at_the_dashboard():
    grafana = DEPLOY / "grafana"
    ds = yaml.safe_load((grafana / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "prometheus" and ds["datasources"][0]["type"] == "prometheus"
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "transformer-serving"
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert "../grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    provider = yaml.safe_load((grafana / "provisioning" / "dashboards" / "dashboards.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


@pytest.mark.parametrize(
    "script",
    [
        DEPLOY / "scripts" / "build-base-image.sh",
        DEPLOY / "scripts" / "build-image.sh",
        ROOT / ".ci" / "deploy-tools.sh",
    ],
)
def test_shell_scripts_parse(script):
    result = run([shutil.which("bash"), "-n", str(script)])
    assert result.returncode == 0, result.stderr
