"""Generation-only Prometheus series; buckets come from service/metrics.py (defined once).

Names are public (dashboards and alerts use them):
- ts_time_to_first_token_seconds{model}: arrival -> first generated token (histogram)
- ts_inter_token_latency_seconds{model}: between consecutive tokens of one generation (histogram)
- ts_generations_in_flight{model}: generations queued or running; back to 0 once every row is freed
- ts_generation_batch_size{model}: rows in one decode step (histogram)
- ts_prefix_cache_lookups_total{model}, ts_prefix_cache_hits_total{model}: prefilled requests, and
  those that started from cached tokens (hit ratio = hits / lookups)
- ts_prefix_cache_cached_tokens_total{model}: prompt tokens taken from the cache, not computed
- ts_speculative_tokens_total{model, outcome}: drafted tokens verified, "accepted" or "rejected"
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from service.metrics import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS

TIME_TO_FIRST_TOKEN = Histogram(
    "ts_time_to_first_token_seconds",
    "time from a generation's arrival to its first token",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "ts_inter_token_latency_seconds",
    "time between consecutive tokens of one generation",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
IN_FLIGHT = Gauge(
    "ts_generations_in_flight",
    "generations queued or running (cache rows not yet freed)",
    ["model"],
    multiprocess_mode="livesum",
)
GENERATION_BATCH_SIZE = Histogram(
    "ts_generation_batch_size",
    "rows in one decode step of a generation model",
    ["model"],
    buckets=BATCH_SIZE_BUCKETS,
)
PREFIX_LOOKUPS = Counter(
    "ts_prefix_cache_lookups_total", "generations prefilled, each looked up in the prefix cache", ["model"]
)
PREFIX_HITS = Counter(
    "ts_prefix_cache_hits_total", "generations whose prompt started from tokens already in the KV cache", ["model"]
)
PREFIX_CACHED_TOKENS = Counter(
    "ts_prefix_cache_cached_tokens_total", "prompt tokens taken from the KV cache instead of prefilled", ["model"]
)
SPECULATIVE_TOKENS = Counter(
    "ts_speculative_tokens_total",
    "tokens drafted by prompt lookup and verified, by outcome (accepted, rejected)",
    ["model", "outcome"],
)
