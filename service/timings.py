"""`Timings`: the milliseconds of a call's stages, one type in the answer of every core (embedding,
fill-mask, generation, translation, attention) and one converter to the protos' Timings
(service/grpc/converters.py `timings`). Stages a kind does not have stay 0."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Timings:
    """Milliseconds, as the protos' Timings."""

    tokenize_ms: float = 0.0
    queue_ms: float = 0.0
    inference_ms: float = 0.0
    total_ms: float = 0.0
    time_to_first_token_ms: float = 0.0

    @classmethod
    def of_seconds(cls, total: float, tokenize: float = 0.0, queue: float = 0.0, inference: float = 0.0) -> Timings:
        """Stages measured in seconds (time.perf_counter()), as milliseconds."""
        return cls(tokenize_ms=tokenize * 1e3, queue_ms=queue * 1e3, inference_ms=inference * 1e3, total_ms=total * 1e3)
