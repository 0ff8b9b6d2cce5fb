"""onnxruntime in one place: execution-provider choice, session creation, the compute executor.

`Runtime` is built once from Settings and shared by every model. `create_session(path)` asks for
CUDA when `device` is "cuda" (or "auto" and onnxruntime offers it), else CPU, then reads the
providers actually in use, since onnxruntime falls back to CPU silently when the CUDA libraries are
missing: the provider is logged and exposed, and with `strict_provider` a fallback raises
`ProviderError`. `await run(fn, *args)` runs blocking compute in one bounded executor of
`compute_workers` threads, never on the event loop. Also here: the variant to serve
(`choose_variant`), a CUDA-graph session for decode steps, the embedding batch limits by device,
the drain `gate` every model's admission checks, and the process's KV-cache budget. The CUDA
provider options and why: docs/design/gpu.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import onnxruntime as ort

from service.admission import Gate
from service.manifest import Manifest, ModelDirError
from service.settings import Settings

log = logging.getLogger(__name__)


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """This CPU's model name and flags (/proc/cpuinfo); ("unknown", {}) where it cannot be read."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown", frozenset()
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in info.splitlines() if ":" in line)}
    return fields.get("model name", "unknown"), frozenset(fields.get("flags", "").split())


CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
CUDA_OPTIONS = {"device_id": "0", "arena_extend_strategy": "kSameAsRequested", "do_copy_in_default_stream": "1"}
# Embedding batch limits where the settings leave them 0: (token budget, rows). CUDA's are sized for
# the GPU's parallelism (the bare engine on an H100: 44k sentences/s in batches of 32 rows, 132k in
# 512; GPU.md), not measured through the service; the CPU's are the ones measured on 2 cores.
EMBED_BATCH_LIMITS = {CPU: (2048, 32), CUDA: (16384, 256)}
T = TypeVar("T")
QUANTISED = ("int8", "int4")  # judged by the quality gate; served by auto only where it passed
CPU_ORDER = ("int8", "int4", "optimized", "fp32")  # auto on the CPU without export timings


def quality_ok(manifest: Manifest, variant: str, unmeasured: bool = False) -> bool:
    """Every graph of the variant passed the quality gate (unmeasured: what to assume without figures)."""
    graphs = [g for g in manifest.graphs if g.variant == variant]
    return bool(graphs) and all(g.parity.get("quality_ok", unmeasured) for g in graphs)


def gate_verdict(manifest: Manifest, variant: str) -> str:
    """What the quality gate said of the variant's graphs, in a line (logs and ListModels)."""
    parts = []
    for g in (g for g in manifest.graphs if g.variant == variant):
        ok, q = g.parity.get("quality_ok"), g.parity.get("quality") or {}
        line = f"{g.role}: quality gate {'not run' if ok is None else 'passed' if ok else 'failed'}"
        if "perplexity_ratio" in q:  # a decoder's figures (an encoder's: cosines, in the manifest)
            limits = q["limits"]
            line += (
                f" (perplexity ratio {q['perplexity_ratio']:g}, limit {limits['perplexity_ratio_max']:g}; "
                f"top-1 agreement {q['top1_agreement']:g}, limit {limits['top1_agreement_min']:g}; "
                f"batch difference {q['batch_max_abs_diff']:g}; on {q['sample']})"
            )
        parts.append(line)
    return "; ".join(parts)


class ProviderError(RuntimeError):
    """The requested execution provider is not the one in use and strict mode forbids a fallback."""


class Runtime:
    def __init__(self, settings: Settings):
        self.settings = settings
        available = ort.get_available_providers()
        if settings.device == "cuda" and CUDA not in available:
            self._fallback(
                f"device=cuda but this onnxruntime offers only {', '.join(available)} "
                "(install onnxruntime-gpu instead of onnxruntime)"
            )
        wants_cuda = settings.device == "cuda" or (settings.device == "auto" and CUDA in available)
        self.requested_provider = CUDA if wants_cuda else CPU
        self.provider = self.requested_provider  # replaced by what the first session reports
        self._cuda_offered = CUDA in available
        self._executor = ThreadPoolExecutor(settings.compute_workers, thread_name_prefix="ts-compute")
        self._closed = False
        self._active, self._busy_s, self._busy_since = 0, 0.0, 0.0  # compute jobs running; busy_seconds()
        self.gate = Gate()  # closed when the server drains: every model's admission refuses then
        self.kv_budget = None  # the generation caches' budget, made at the first load (service/generation/kvbudget.py)

    @property
    def is_cuda(self) -> bool:
        return self.provider == CUDA

    @functools.cached_property
    def spins(self) -> bool:
        """Whether a session's intra-op threads spin between kernels rather than sleep: only with
        several threads (one has no pool) that have cores to themselves (processes running models x
        compute workers x threads <= usable cores; `--workers 0` sizes its workers to fit). Measured on
        2 vCPUs (docs/performance.md): a SmolLM-135M-shaped int8 decoder at 2 threads and 1 compute
        worker decoded 115.7 tokens/s at one stream spinning against 81.4 sleeping, 482 against 359 at
        eight, for less CPU per token (16.8 against 18.2 ms; 4.0 against 4.2), since a sleeping pool is
        woken for every kernel. Where the threads outnumber the cores, spinning burns the CPU that
        parallel batches and other processes need.
        """
        from service.settings import usable_cores  # at the call: tests replace it

        s = self.settings
        processes = max(1, s.engines) if s.frontends > 0 else max(1, s.workers)  # as the supervisor counts them
        return s.intra_op_threads > 1 and processes * s.compute_workers * s.intra_op_threads <= usable_cores()

    def session_options(self) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.settings.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spins else "0")
        opts.log_severity_level = 3  # errors only; the fallback is detected and logged below
        return opts

    def create_session(self, path: str | Path) -> ort.InferenceSession:
        """An InferenceSession on the chosen provider; raises ProviderError on a strict fallback and
        ModelDirError naming the file when onnxruntime cannot load it."""
        providers: list[Any] = [CPU]
        if self.requested_provider == CUDA and self._cuda_offered:
            providers = [(CUDA, CUDA_OPTIONS), CPU]
        try:
            session = ort.InferenceSession(str(path), sess_options=self.session_options(), providers=providers)
        except Exception as e:  # onnxruntime's own exception types (InvalidProtobuf, Fail...) share no base
            raise ModelDirError(
                f"{path}: onnxruntime cannot load this graph ({e}); re-export the model, or check "
                "it against its manifest's sha256 (--verify-hashes)"
            ) from e
        used = session.get_providers()[0]
        if used != self.requested_provider:
            self._fallback(
                f"{Path(path).name}: asked for {self.requested_provider}, onnxruntime runs {used} "
                "(CUDA/cuDNN libraries missing or incompatible?)"
            )
        self.provider = used
        return session

    def create_graph_session(self, path: str | Path) -> tuple[ort.InferenceSession | None, str]:
        """A session of the decoder at path whose runs capture and replay CUDA graphs (one per
        `gpu_graph_id`), or None and why not: the setting is off, the provider is not CUDA, or
        onnxruntime refused (it requires every compute node on CUDA; GroupQueryAttention has CUDA
        kernels for fp16 and bf16 only, so an fp32 decoder cannot)."""
        if not self.settings.cuda_graph:
            return None, "the cuda_graph setting is off"
        if self.provider != CUDA:
            return None, f"they need {CUDA} and this model runs on {self.provider}"
        options = {**CUDA_OPTIONS, "enable_cuda_graph": "1"}
        try:
            session = ort.InferenceSession(str(path), sess_options=self.session_options(), providers=[(CUDA, options)])
        except Exception as e:  # onnxruntime's own exception types (Fail, InvalidArgument...) share no base
            return None, f"onnxruntime refused a CUDA-graph session for {Path(path).name}: {e}"
        return session, "on"

    def embed_batch_limits(self) -> tuple[int, int]:
        """(max_batch_tokens, max_batch_size) of embedding batches: the settings', or by device where 0."""
        tokens, rows = EMBED_BATCH_LIMITS[CUDA if self.is_cuda else CPU]
        return self.settings.embed_max_batch_tokens or tokens, self.settings.embed_max_batch_size or rows

    def _fallback(self, reason: str) -> None:
        if self.settings.strict_provider:
            raise ProviderError(f"{reason}; refusing to start (strict_provider is set)")
        log.warning("%s; falling back to %s", reason, CPU)

    def choose_variant(self, manifest: Manifest, role: str) -> str:
        """The graph variant to serve for role: the settings' choice, or auto.

        auto on CUDA: fp16 (unless the gate judged its quality below the limits), else optimized,
        else fp32. auto on CPU: among optimized, fp32 and the quantised variants (int8, int4) that
        the gate measured on held-out text and found within its quality limits, each row independent
        of its batch (`quality_ok`, export/gate/parity.py), the fastest by the decode steps the
        export timed on its machine (`parity.speed`, export/gate/speed.py); without those timings
        int8, then int4, then optimized, then fp32. A quantised variant the gate refused is logged
        with its figures, never left out silently.
        """
        have = manifest.variants(role)
        wanted = self.settings.variant
        if wanted != "auto":
            if wanted not in have:
                raise ValueError(
                    f"model {manifest.name!r}: variant {wanted!r} requested but its {role} "
                    f"graph comes only as {', '.join(have)}"
                )
            return wanted
        if self.requested_provider == CUDA:
            order = [
                v for v in ("fp16", "optimized", "fp32") if v != "fp16" or quality_ok(manifest, v, unmeasured=True)
            ]
            return next(v for v in order if v in have)
        admitted = [v for v in CPU_ORDER if v in have and (v not in QUANTISED or quality_ok(manifest, v))]
        for v in (v for v in QUANTISED if v in have and v not in admitted):
            log.warning("model %s: %s not served: %s", manifest.name, v, gate_verdict(manifest, v))
        timed = manifest.parity.get("speed", {}).get("step_us", {})
        if not all(v in timed for v in admitted):
            return admitted[0]
        chosen = min(admitted, key=lambda v: timed[v])
        cpu = manifest.parity["speed"].get("cpu", {}).get("name", "unknown")
        log.info(
            "model %s: auto serves %s, the fastest the gate admitted (decode step us on %s at export: %s)",
            manifest.name,
            chosen,
            cpu,
            ", ".join(f"{v} {timed[v]:g}" for v in admitted),
        )
        return chosen

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs fn(*args) in the compute executor and awaits its result."""
        loop = asyncio.get_running_loop()
        self._active += 1
        if self._active == 1:
            self._busy_since = time.perf_counter()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(fn, *args))
        finally:
            self._active -= 1
            if not self._active:
                self._busy_s += time.perf_counter() - self._busy_since

    def busy_seconds(self) -> float:
        """Seconds so far during which at least one compute job ran (the engine's busy gauge)."""
        running = time.perf_counter() - self._busy_since if self._active else 0.0
        return self._busy_s + running

    def close(self) -> None:
        """Stops the executor once the running tasks finish."""
        if not self._closed:
            self._closed = True
            self._executor.shutdown(wait=True, cancel_futures=True)
