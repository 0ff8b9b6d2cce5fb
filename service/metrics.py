"""Prometheus metrics of the service, in one place, with the histogram buckets defined once.

The names are public (dashboards and alerts in deploy/ use them). Series shared by every model
kind live here; generation-only series live in service/generation/metrics.py and reuse the buckets.
All metrics are registered on prometheus_client's default registry, served over HTTP on their own
port by `start_metrics_server` (port 0 picks a free port; the port actually bound is returned;
threads and idle connections bounded: service/metrics_server.py).

With several worker processes (service/supervisor.py) prometheus_client runs in multiprocess mode:
each worker writes its samples to files in PROMETHEUS_MULTIPROC_DIR and the supervisor serves their
aggregate. Counters and histograms add up; each gauge says how (`multiprocess_mode`): "livesum"
for amounts the workers hold side by side (queue items, capacity, generations in flight), "livemax"
for the 1-per-model info gauge; "live" drops the values of a worker once it has exited.
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from service import metrics_server

log = logging.getLogger(__name__)

# Seconds: from sub-millisecond (one queue hop) to a long generation.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Rows per batch.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Tokens per batch, padding counted (rows x longest row).
PADDING_BUCKETS = (1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

# Calls of both doors: protocol "grpc" or "http" (an HTTP route is counted as the RPC it mirrors,
# with the gRPC status code its HTTP status maps from; service/http/errors.py).
REQUESTS = Counter(
    "ts_requests", "RPCs handled, by final status code", ["service", "method", "model", "code", "protocol"]
)
REQUEST_DURATION = Histogram(
    "ts_request_duration_seconds",
    "RPC latency, server side, from arrival to the last message",
    ["service", "method", "model", "protocol"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_DURATION = Histogram(
    "ts_queue_duration_seconds",
    "time an item waited in a model's queue before its batch ran",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge("ts_queue_depth", "items waiting in a model's queue", ["model"], multiprocess_mode="livesum")
QUEUE_CAPACITY = Gauge(
    "ts_queue_capacity",
    "most items a model's queue holds before RESOURCE_EXHAUSTED",
    ["model"],
    multiprocess_mode="livesum",
)
BATCH_SIZE = Histogram("ts_batch_size", "rows per model forward pass", ["model"], buckets=BATCH_SIZE_BUCKETS)
BATCH_TOKENS = Histogram(
    "ts_batch_tokens",
    "tokens per forward pass, padding counted (rows x longest row; a packed encoder batch: rows x row length)",
    ["model"],
    buckets=TOKEN_BUCKETS,
)
PADDING_RATIO = Histogram(
    "ts_batch_padding_ratio",
    "tokens an encoder forward pass computes per real input token (1 = no padding)",
    ["model"],
    buckets=PADDING_BUCKETS,
)
TOKENS = Counter(
    "ts_tokens",
    "tokens read (input: counted when the model computes them, every kind: an encoder batch, a "
    "translation's source encoding, a prompt's prefill; none for a call dropped first) and generated (output)",
    ["model", "direction"],
)
MODEL_INFO = Gauge(
    "ts_model_info",
    "1 per served model; labels say what runs where",
    ["model", "kind", "provider", "variant", "requested_provider"],
    multiprocess_mode="livemax",
)
INFERENCE_DURATION = Histogram(
    "ts_inference_duration_seconds",
    "wall time of one engine run: an encoder batch, a generation prefill or "
    "decode step, a translator's encoder run or decoder step",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
DROPPED = Counter(
    "ts_dropped_items",
    "queued items (inputs, generations, sources) dropped before compute because their call was cancelled or expired",
    ["model", "reason"],
)
WORKER_RPCS = Counter(
    "ts_worker_rpcs",
    "calls (gRPC and HTTP) accepted by each worker process (health checks and reflection aside); "
    "only with --workers > 1",
    ["worker"],
)


def start_metrics_server(host: str, port: int) -> tuple[object, int]:
    """Serves /metrics in a daemon thread (bounded: service/metrics_server.py); returns (server, bound
    port). Call `server.shutdown()` to stop."""
    server = metrics_server.start(host, port, REGISTRY)
    bound = server.server_port
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return server, bound
