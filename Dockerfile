# transformer-serving container image (docs/deploy.md).
#
# Stages:
#   builder       CPU torch + `make models`: exports every model and runs the parity gate.
#   cpu-base      python:3.11-slim.
#   gpu-base      an NVIDIA CUDA runtime (with cuDNN) plus Debian/Ubuntu python3.
#   service-venv  /opt/venv with the service and its dependencies; onnxruntime or onnxruntime-gpu.
#   runtime       (default) ${VARIANT}-base + /opt/venv + /models, no torch, non-root.
#
# CPU image:  DOCKER_BUILDKIT=1 docker build -t transformer-serving:cpu .
# GPU image:  DOCKER_BUILDKIT=1 docker build -t transformer-serving:gpu \
#                 --build-arg VARIANT=gpu --build-arg ONNXRUNTIME=onnxruntime-gpu .
# CPU torch for the builder comes from TORCH_INDEX_URL (PyTorch's CPU index) or, where that index
# cannot be reached, from wheels placed in deploy/wheels/ with TORCH_INDEX_URL set empty.

ARG PYTHON_BASE=python:3.11-slim
ARG CUDA_BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
ARG VARIANT=cpu

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS builder
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml Makefile README* ./
COPY export/ export/
COPY service/ service/
# The venv first, in its own layer: it changes only with pyproject.toml.
RUN --mount=type=bind,source=deploy/wheels,target=/wheels \
    PIP_FIND_LINKS=/wheels PIP_EXTRA_INDEX_URL="${TORCH_INDEX_URL}" make venv PYTHON=python3
# Trained checkpoints, where the repository has them (the wildcard lets the folder be absent).
COPY checkpoint[s]/ checkpoints/
RUN make models PYTHON=python3 MODELS=/models

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS cpu-base

FROM ${CUDA_BASE} AS gpu-base
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && ln -sf /usr/bin/python3 /usr/local/bin/python

# ---------------------------------------------------------------------------------------------
# hadolint ignore=DL3006
FROM ${VARIANT}-base AS service-venv
ARG ONNXRUNTIME=onnxruntime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README* ./
COPY service/ service/
COPY client/ client/
# Only the serving and client packages are copied, so only they are installed (no export/, no
# torch); the client is the HEALTHCHECK (`python -m client health`) and the batch job
# (`ts-embed-batch`). A GPU build swaps onnxruntime for onnxruntime-gpu of the same version: the
# two must never be installed side by side.
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install ".[batch]" \
    && if [ "${ONNXRUNTIME}" != "onnxruntime" ]; then \
           ort="$(/opt/venv/bin/python -c 'import importlib.metadata as m; print(m.version("onnxruntime"))')" \
           && /opt/venv/bin/pip uninstall -y onnxruntime \
           && /opt/venv/bin/pip install "${ONNXRUNTIME}==${ort}"; \
       fi \
    && /opt/venv/bin/python -c "import onnxruntime, service.proto.inference_pb2_grpc, client.batch.cli"

# ---------------------------------------------------------------------------------------------
# hadolint ignore=DL3006
FROM ${VARIANT}-base AS runtime
LABEL org.opencontainers.image.title="transformer-serving" \
      org.opencontainers.image.description="Embeddings, generation and translation over gRPC (onnxruntime)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TS_MODELS=/models \
    TS_HOST=0.0.0.0 \
    TS_PORT=50051 \
    TS_METRICS_PORT=9464 \
    TS_HTTP_PORT=8080
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent serving
COPY --from=service-venv /opt/venv /opt/venv
COPY --from=builder /models /models
USER 10001:10001
EXPOSE 50051 9464 8080
# gRPC health of the whole server: exit 0 only when SERVING (after every model's warm-up).
# sh -c so that the probe follows TS_PORT when it is overridden at run time.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/bin/sh", "-c", "exec python -m client --address 127.0.0.1:${TS_PORT} --timeout 4 health"]
# Exec form: the server is PID 1 and handles SIGTERM itself (graceful drain, then exit 0).
ENTRYPOINT ["python", "-m", "service"]
