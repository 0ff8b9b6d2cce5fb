#!/usr/bin/env bash
# Builds a local stand-in for the Dockerfile's base image when no image registry can be reached:
# a Debian bookworm root file system (debootstrap, minbase) with Debian's Python 3.11, venv and pip,
# imported into Docker under the base image's name (default python:3.11-slim).
#
# The host's extra CA certificates (/usr/local/share/ca-certificates/*.crt) are copied in so pip
# can reach PyPI through a TLS-intercepting egress proxy, and EXTERNALLY-MANAGED is removed so pip
# behaves as in the official python image. Idempotent: an existing tag is kept unless --force.
#
# Usage: deploy/scripts/build-base-image.sh [--force] [TAG ...]
#   TAG defaults to python:3.11-slim; give several tags to tag the same image more than once
#   (e.g. a stand-in for the GPU target's nvidia/cuda base, see docs/deploy.md).
# Needs root, debootstrap and a running Docker engine.
set -euo pipefail

FORCE=0
if [ "${1:-}" = "--force" ]; then FORCE=1; shift; fi
TAGS=("$@")
[ ${#TAGS[@]} -gt 0 ] || TAGS=("python:3.11-slim")
SUITE="${BASE_SUITE:-bookworm}"
MIRROR="${BASE_MIRROR:-http://deb.debian.org/debian}"
DOCKER="${DOCKER:-docker}"

log() { echo "[build-base-image] $*" >&2; }

missing=()
for tag in "${TAGS[@]}"; do
    if [ "$FORCE" = 1 ] || ! "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then missing+=("$tag"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
    log "already present: ${TAGS[*]} (use --force to rebuild)"
    exit 0
fi

ROOTFS="$(mktemp -d /tmp/base-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT

log "debootstrap $SUITE into $ROOTFS"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null

if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
fi
chroot "$ROOTFS" update-ca-certificates >/dev/null
rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED
# The official image has `python` and `pip`; Debian only has the python3 names.
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$ROOTFS/usr/local/bin/pip"
chroot "$ROOTFS" apt-get clean
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin

first="${missing[0]}"
log "importing as $first"
tar -C "$ROOTFS" -c . | "$DOCKER" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    - "$first" >/dev/null
for tag in "${missing[@]:1}"; do "$DOCKER" tag "$first" "$tag"; done
log "done: ${missing[*]} ($("$DOCKER" image inspect -f '{{.Size}}' "$first") bytes)"
