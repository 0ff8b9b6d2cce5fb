"""The generation scheduler's metric children, resolved once per model, and batched observations.

A decode step of B rows makes B inter-token latency observations, nearly all of one value (the
rows of the previous step share its time): `observe_many` records them in one update.
"""

from __future__ import annotations

from service import metrics
from service.generation import metrics as gen_metrics


class Series:
    """The model's per-token metric children, resolved once (`labels()` costs microseconds a call)."""

    def __init__(self, name: str):
        self.ttft = gen_metrics.TIME_TO_FIRST_TOKEN.labels(name)
        self.itl = gen_metrics.INTER_TOKEN_LATENCY.labels(name)
        self.inference = metrics.INFERENCE_DURATION.labels(name)
        self.batch = metrics.BATCH_SIZE.labels(name)
        self.batch_tokens = metrics.BATCH_TOKENS.labels(name)
        self.decode_batch = gen_metrics.GENERATION_BATCH_SIZE.labels(name)
        self.input_tokens = metrics.TOKENS.labels(name, "input")
        self.output_tokens = metrics.TOKENS.labels(name, "output")
        self.in_flight = gen_metrics.IN_FLIGHT.labels(name)


def observe_many(histogram, value: float, count: int) -> None:
    """`count` observations of one value in a prometheus_client Histogram child: what `observe`
    does count times (sum, then the first bucket whose bound holds the value) in one update.
    It uses the Histogram's own fields (`_sum`, `_upper_bounds`, `_buckets`, as `observe` does);
    tests/service/generation/test_scheduler_unit.py checks it against `observe` for the installed version."""
    histogram._sum.inc(value * count)
    for i, bound in enumerate(histogram._upper_bounds):
        if value <= bound:
            histogram._buckets[i].inc(count)
            break
