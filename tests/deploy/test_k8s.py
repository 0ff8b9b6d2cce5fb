"""Kubernetes manifests: every kustomization rendered by `kubectl kustomize` and validated by
`kubernetes-validate --strict` (offline schemas of Kubernetes 1.37), plus the invariants the
schemas cannot see (threads vs CPU limits, grace periods, probes, shard counts).

The PodMonitor is a Prometheus Operator CRD, for which kubernetes-validate ships no schema (it
warns and passes it); it is checked here against the Deployment it must scrape instead.
"""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.tools import DEPLOY, run, tool

K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/gpu", "overlays/secure", "jobs/embed"]
CRD_KINDS = {"PodMonitor"}
pytestmark = pytest.mark.deploy  # kubectl kustomize renders every manifest (make test-deploy)


def render(path: str) -> list[dict]:
    result = run([tool("kubectl"), "kustomize", str(K8S / path)])
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def cpus(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_rendered_manifests_pass_strict_validation(path, tmp_path):
    docs = render(path)
    validate = tool("kubernetes-validate")
    for i, doc in enumerate(docs):
        if doc["kind"] in CRD_KINDS:
            continue
        f = tmp_path / f"{i}-{doc['kind']}.yaml"
        f.write_text(yaml.safe_dump(doc))
        result = run([validate, "--strict", "--quiet", str(f)])
        assert result.returncode == 0, f"{path} {doc['kind']}: {result.stdout}{result.stderr}"
        assert "Couldn't find schema" not in result.stdout + result.stderr


def test_validation_can_fail(tmp_path):
    """--strict rejects an unknown field: the check above is not vacuous."""
    doc = render("overlays/cpu")
    deployment = by_kind(doc, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(deployment))
    assert run([tool("kubernetes-validate"), "--strict", "--quiet", str(f)]).returncode != 0


@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu"])
def test_deployment_is_production_shaped(overlay):
    docs = render(overlay)
    deployment = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    limits = container["resources"]["limits"]
    # Threads fill the CPU limit exactly: worker processes x compute workers x intra-op threads.
    threads = int(env["TS_WORKERS"]) * int(env["TS_COMPUTE_WORKERS"]) * int(env["TS_INTRA_OP_THREADS"])
    assert threads == cpus(limits["cpu"])
    assert container["resources"]["requests"]["cpu"] == limits["cpu"]
    # SIGKILL comes only after preStop + the server's drain.
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + float(env["TS_GRACE_SECONDS"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == 50051
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {p["name"] for p in container["ports"]} == {"grpc", "metrics", "http"}
    http = next(p for p in container["ports"] if p["name"] == "http")
    assert http["containerPort"] == int(env["TS_HTTP_PORT"])  # the OpenAI-compatible door
    if overlay.endswith("gpu"):
        assert limits["nvidia.com/gpu"] == "1" and env["TS_DEVICE"] == "cuda"
        assert container["image"] == "transformer-serving:gpu"
    else:
        assert "nvidia.com/gpu" not in limits and env["TS_DEVICE"] == "cpu"
        assert container["image"] == "transformer-serving:cpu"


def test_secure_overlay_mounts_tls_and_tokens_from_secrets():
    """Every file the server reads is on a read-only mount of a Secret; probes speak TLS (the
    kubelet's gRPC probe cannot) through the client, which finds the CA the same way."""
    pod = by_kind(render("overlays/secure"), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert set(secrets.values()) == {"transformer-serving-tls", "transformer-serving-tokens"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"] if m["name"] in secrets}
    for name in ("TS_TLS_CERT", "TS_TLS_KEY", "TS_AUTH_TOKENS_FILE", "TS_TLS_CA"):
        folder, _, _ = env[name].rpartition("/")
        assert folder in mounts and mounts[folder]["readOnly"], name
    assert "TS_AUTH_TOKENS" not in env  # tokens never in the manifest
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert "grpc" not in container[probe] and command[:3] == ["python", "-m", "client"]
        timeout = float(command[command.index("--timeout") + 1])
        assert command[-1] == "health" and container[probe]["timeoutSeconds"] > timeout
    assert int(env["TS_WORKERS"]) * int(env["TS_COMPUTE_WORKERS"]) == cpus(container["resources"]["limits"]["cpu"])


def test_services_hpa_pdb_and_podmonitor_select_the_serving_pods():
    docs = render("overlays/cpu")
    deployment = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    services = [d for d in docs if d["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} == {"transformer-serving", "transformer-serving-headless"}
    for s in services:
        assert s["spec"]["selector"].items() <= pod_labels.items()
        assert any(p["name"] == "grpc" and p["appProtocol"] == "grpc" for p in s["spec"]["ports"])
    headless = next(s for s in services if s["metadata"]["name"].endswith("headless"))
    assert headless["spec"]["clusterIP"] == "None"
    pdb = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    monitor = by_kind(docs, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert all(e["port"] in ports and e["path"] == "/metrics" for e in monitor["spec"]["podMetricsEndpoints"])


def test_indexed_job_shards_match_completions():
    docs = render("jobs/embed")
    job = by_kind(docs, "Job")
    spec = job["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)
    assert spec["completionMode"] == "Indexed"
    assert int(args["shard-count"]) == spec["completions"]
    assert "{shard" in args["output"]  # one output file per index
    assert container["command"] == ["python", "-m", "client.batch"]
    assert args["address"].startswith("dns:///transformer-serving-headless")
    claim = by_kind(docs, "PersistentVolumeClaim")["metadata"]["name"]
    volumes = spec["template"]["spec"]["volumes"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim for v in volumes)
    assert container["securityContext"]["readOnlyRootFilesystem"]
