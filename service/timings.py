"""`Timings`: the milliseconds of a decoder call's stages (generation, translation), as plain values
the cores return and the converters turn into the protos' Timings (service/converters.py)."""

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
