"""Decode-step timings of a decoder's variants on the exporting machine, for `variant=auto`.

After the gate, every built variant of a generation model is timed side by side in one process:
a decode step (one new token per row after `PAST` cached positions, past and present on one
buffer as the service binds them) at 1 row and at 8 rows, one intra-op thread, `STEPS` steps a
round (fewer for a step so slow that they would pass `ROUND_S`), the variants alternated over
`ROUNDS` rounds and the median kept, so load on a shared machine falls on all of them alike (a
model past 2 GiB: each variant's rounds in turn, one session at a time, `alternated: false`). The
manifest records the figures with the CPU's name and flags (`parity.speed`); the service's `auto`
serves the fastest variant the quality gate admitted (service/runtime.py), so no CPU's figure is
written into code. `step_us` is a 1-row step plus an 8-row step: a lone stream and a busy server
weigh alike.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from export.gate.parity import session
from export.onnx import store
from service.runtime import cpu_info

log = logging.getLogger(__name__)

ROWS = (1, 8)
PAST = 64
STEPS = 8  # timed steps per round at most, after one untimed step ...
ROUND_S = 0.1  # ... and fewer where that many would take longer than this (a 124M fp32 step: ~35 ms)
ROUNDS = 5
_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")


def cpu() -> dict:
    """The CPU's model name and its flags that decide which integer kernels run (from /proc/cpuinfo)."""
    name, flags = cpu_info()
    return {"name": name, "flags": [f for f in _FLAGS if f in flags]}


def _feeds(sess, rows: int) -> dict[str, np.ndarray]:
    """A decode step's inputs: one token per row after PAST positions, KV buffers of the graph's kind."""
    inputs = sess.get_inputs()
    past = [i for i in inputs if i.name.startswith("past_key_values.")]
    kv = past[0]  # (batch, kv heads, max_sequence, head size)
    dtype = np.float16 if kv.type == "tensor(float16)" else np.float32
    slots = max(2 * PAST, 128)
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.ones((rows, 1), np.int64),
        "position_ids": np.full((rows, 1), PAST, np.int64),
        "seqlens_k": np.full((rows,), PAST, np.int32),
        "total_sequence_length": np.asarray(PAST + 1, np.int32),
    }
    if any(i.name == "logits_positions" for i in inputs):
        feeds["logits_positions"] = np.zeros((rows, 1), np.int64)
    feeds.update({i.name: np.zeros((rows, kv.shape[1], slots, kv.shape[3]), dtype) for i in past})
    return feeds


def _binding(sess, rows: int) -> tuple[Any, dict[str, np.ndarray]]:
    """A decode step bound as the service binds it (service/generation/cache.py): each layer's past
    and present on the same buffer, so the graph writes the new position in place rather than
    copying the whole cache out (which timed an 8-row GPT-2-small step ~3 ms slower than served)."""
    feed = _feeds(sess, rows)
    binding = sess.io_binding()
    for name, array in feed.items():
        if name.startswith("past_key_values."):
            shape, ptr = list(array.shape), array.ctypes.data
            binding.bind_input(name, "cpu", 0, array.dtype.type, shape, ptr)
            binding.bind_output(name.replace("past_key_values.", "present.", 1), "cpu", 0, array.dtype.type, shape, ptr)
        else:
            binding.bind_cpu_input(name, array)
    binding.bind_output("logits", "cpu")
    return binding, feed  # the feed's arrays hold the bound memory


def _round(sess, variant: str, times: dict[tuple[str, int], list[float]]) -> None:
    """One round of a variant: per row count, one untimed step, then up to STEPS timed ones."""
    for rows in ROWS:
        binding, _held = _binding(sess, rows)
        started = time.perf_counter()
        sess.run_with_iobinding(binding)
        steps = min(STEPS, max(2, round(ROUND_S / (time.perf_counter() - started))))
        started = time.perf_counter()
        for _ in range(steps):
            sess.run_with_iobinding(binding)
        times[variant, rows].append((time.perf_counter() - started) / steps * 1e6)


def decode_steps(graphs: dict[str, Path]) -> dict:
    """variant -> its decoder graph -> {"cpu", "threads", "past", "rows", "decode_step_us": {variant:
    {rows: us}}, "step_us": {variant: us}} (the module doc says what is timed)."""
    times: dict[tuple[str, int], list[float]] = {(v, r): [] for v in graphs for r in ROWS}
    alternated = not any(store.data_file(p).exists() for p in graphs.values())
    if alternated:
        sessions = {v: session(p, prepack=True, threads=1) for v, p in graphs.items()}
        for _ in range(ROUNDS):
            for variant, sess in sessions.items():
                _round(sess, variant, times)
    else:  # past 2 GiB: one variant's session at a time (each holds its prepacked weights)
        for variant, path in graphs.items():
            sess = session(path, prepack=True, threads=1)
            for _ in range(ROUNDS):
                _round(sess, variant, times)
            del sess
    us = {v: {str(r): round(statistics.median(times[v, r]), 1) for r in ROWS} for v in graphs}
    figures: dict[str, Any] = {
        "cpu": cpu(),
        "threads": 1,
        "past": PAST,
        "rows": list(ROWS),
        "decode_step_us": us,
        "step_us": {v: round(sum(by_rows.values()), 1) for v, by_rows in us.items()},
    }
    if not alternated:
        figures["alternated"] = False
    log.info("decode steps on %s: %s", figures["cpu"]["name"], figures["step_us"])
    return figures
