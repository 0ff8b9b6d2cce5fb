#!/usr/bin/env bash
# Builds the service image: transformer-serving:cpu (default) or transformer-serving:gpu.
#
# Usage: deploy/scripts/build-image.sh [cpu|gpu] [--torch-wheel WHEEL] [--tag TAG] [docker build args...]
#   --torch-wheel  a torch-*+cpu wheel for the builder stage, for machines that cannot reach the
#                  PyTorch CPU index: linked into deploy/wheels/ and the index switched off.
# Picks a docker CLI that builds with BuildKit: `docker` when it has buildx (Docker 23+), else
# Debian docker.io's /usr/bin/docker with DOCKER_BUILDKIT=1 (it uses the engine's own BuildKit).
# Without a registry, build the base image first: deploy/scripts/build-base-image.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"

VARIANT=cpu
if [ "${1:-}" = cpu ] || [ "${1:-}" = gpu ]; then VARIANT="$1"; shift; fi
TAG="transformer-serving:$VARIANT"
ARGS=(--build-arg "VARIANT=$VARIANT")
[ "$VARIANT" = gpu ] && ARGS+=(--build-arg ONNXRUNTIME=onnxruntime-gpu)
while [ $# -gt 0 ]; do
    case "$1" in
        --torch-wheel)
            wheel="$2"; shift 2
            [ -f "$wheel" ] || { echo "no such wheel: $wheel" >&2; exit 2; }
            target="$ROOT/deploy/wheels/$(basename "$wheel")"
            [ -e "$target" ] || ln "$wheel" "$target" 2>/dev/null || cp "$wheel" "$target"
            ARGS+=(--build-arg TORCH_INDEX_URL=) ;;
        --tag) TAG="$2"; shift 2 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done

DOCKER="${DOCKER:-docker}"
if ! "$DOCKER" buildx version >/dev/null 2>&1; then
    if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; fi
    export DOCKER_BUILDKIT=1
fi
echo "[build-image] $DOCKER build -t $TAG ${ARGS[*]} $ROOT" >&2
"$DOCKER" build -t "$TAG" "${ARGS[@]}" "$ROOT"
"$DOCKER" image inspect -f "[build-image] $TAG: {{.Size}} bytes" "$TAG" >&2
