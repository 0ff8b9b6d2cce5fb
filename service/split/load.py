"""What the engine core tells front ends about its models (`served_models`), and the operator's two
series of its load (`EngineLoad`): `ts_engine_cpu_seconds_total{device,engine}`, the engine process's
own CPU, and `ts_engine_busy_ratio{device,engine}`, the fraction of the last interval during which it computed
(at least one compute job running) rather than waited: the saturation signal for autoscaling."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from prometheus_client import Counter, Gauge

from service.registry import ModelRegistry
from service.runtime import Runtime
from service.split.wire import Served

ENGINE_CPU = Counter("ts_engine_cpu_seconds_total", "CPU seconds of the engine core process", ["device", "engine"])
ENGINE_BUSY = Gauge(
    "ts_engine_busy_ratio",
    "fraction of the last interval the engine core computed (a compute job running) rather than waited",
    ["device", "engine"],
    multiprocess_mode="livemax",
)
INTERVAL_S = 1.0


def served_models(registry: ModelRegistry) -> list[Served]:
    """Each model's info and directory, and for a generation model the values a front end validates,
    renders chats and tokenizes with (service/split/models.py)."""
    out = []
    for backend in registry:
        generation = None
        if backend.kind == "generation":
            m = backend  # a GenerationModel
            generation = {
                "graph_vocab": m.io.vocab_size,  # type: ignore[attr-defined]
                "context": m.context,  # type: ignore[attr-defined]
                "max_prompt": m.max_prompt,  # type: ignore[attr-defined]
                "max_prompt_chars": m.max_prompt_chars,  # type: ignore[attr-defined]
                "eos_ids": sorted(m.eos_ids),  # type: ignore[attr-defined]
                "max_queue": m.scheduler.admission.capacity,  # type: ignore[attr-defined]
                "tokenizer_info": dataclasses.asdict(m.tokenizer_info),  # type: ignore[attr-defined]
            }
        embedding = None
        if backend.kind == "embedding":
            embedding = {"max_queue": backend.batcher.admission.capacity}  # type: ignore[attr-defined]
        path = str(registry.dirs.get(backend.name, ""))
        served = Served(
            backend.name,
            backend.kind,
            backend.provider,
            backend.variant,
            backend.info(),
            path,
            generation=generation,
            embedding=embedding,
        )
        out.append(served)
    return out


class EngineLoad:
    """Samples the process's CPU time and the compute executor's busy time every INTERVAL_S."""

    def __init__(self, runtime: Runtime, index: int):
        self.runtime = runtime
        device = "cuda" if runtime.is_cuda else "cpu"
        self.cpu = ENGINE_CPU.labels(device, str(index))
        self.busy = ENGINE_BUSY.labels(device, str(index))

    async def run(self) -> None:
        cpu, busy, wall = time.process_time(), self.runtime.busy_seconds(), time.perf_counter()
        while True:
            await asyncio.sleep(INTERVAL_S)
            cpu_now, busy_now, wall_now = time.process_time(), self.runtime.busy_seconds(), time.perf_counter()
            self.cpu.inc(cpu_now - cpu)
            self.busy.set(min(1.0, (busy_now - busy) / (wall_now - wall)))
            cpu, busy, wall = cpu_now, busy_now, wall_now
