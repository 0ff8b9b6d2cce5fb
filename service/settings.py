"""Service settings: one frozen, typed object read from `TS_`-prefixed environment variables.

Every field has a default and a one-line doc (`metadata["doc"]`), which is also the help text of
its command-line flag: field `metrics_port` is env `TS_METRICS_PORT` and flag `--metrics-port`.
Precedence: flag > environment variable > default. (MLServer `settings.py`.)

    settings = Settings.from_env()                       # defaults + TS_* variables
    settings = Settings.from_args(["--port", "0"])      # ... + flags
    settings = dataclasses.replace(settings, port=0)    # tests
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ENV_PREFIX = "TS_"
DEVICES = ("auto", "cpu", "cuda")
VARIANT_CHOICES = ("auto", "fp32", "optimized", "fp16", "int8", "int4")
TOOL_PARSERS = ("hermes", "llama3_json", "mistral")  # tool-call formats (service/generation/tools.py)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _f(default: Any, doc: str, **extra: Any) -> Any:
    return field(default=default, metadata={"doc": doc, **extra})


@dataclass(frozen=True)
class Settings:
    # Server
    models: str = _f("models", "root folder holding one model directory per served model")
    host: str = _f("127.0.0.1", "gRPC listen address (0.0.0.0 in a container)")
    port: int = _f(50051, "gRPC port; 0 picks a free one (logged at start)")
    metrics_host: str = _f("", "metrics HTTP listen address; empty = same as --host")
    metrics_port: int = _f(9464, "Prometheus metrics HTTP port; 0 picks a free one; -1 disables it")
    http_host: str = _f("", "HTTP (OpenAI-compatible) listen address; empty = same as --host")
    http_port: int = _f(8080, "HTTP (OpenAI-compatible) port; 0 picks a free one (logged); -1 turns HTTP off")
    http_header_timeout_s: float = _f(
        10.0,
        "seconds an HTTP client has to send a request's headers, from the "
        "connection's opening or its previous response; then the connection is closed",
    )
    http_body_timeout_s: float = _f(
        60.0,
        "seconds an HTTP client has to send a request's whole body once the route "
        "reads it; then 408 and the connection is closed",
    )
    http_write_timeout_s: float = _f(
        30.0,
        "seconds an HTTP response may wait on a client that reads none of it (the "
        "connection's send buffer stays full); then the connection is closed and its answer freed",
    )
    http_max_connections: int = _f(1024, "open HTTP connections per process; one more gets 503 and is closed")
    grace_seconds: float = _f(10.0, "on SIGTERM, how long in-flight calls may take to finish")
    max_message_bytes: int = _f(16 * 1024 * 1024, "largest gRPC message (or HTTP body) accepted or sent, in bytes")
    grpc_max_streams: int = _f(
        1024,
        "gRPC calls open at once on one connection (HTTP/2 streams, answers not yet taken by the "
        "client included); more are refused with REFUSED_STREAM until one ends",
    )
    log_level: str = _f("INFO", "logging level: DEBUG, INFO, WARNING, ERROR")
    verify_hashes: bool = _f(True, "check every model file's sha256 against its manifest at load")
    workers: int = _f(
        1,
        "serving processes sharing the gRPC port under one supervisor (docs/design/workers.md); "
        "1 = one process, no supervisor; 0 = auto (1 on CUDA; on CPU cores / compute threads)",
    )
    frontends: int = _f(
        0,
        "front-end processes (every door, chat rendering) in front of one engine core process that holds "
        "the models (docs/design/engine-core.md); 0 = auto (several on a CUDA host, else off); -1 = off",
    )
    engines: int = _f(
        0,
        "with --frontends: engine core processes, each holding every model on its own device (data "
        "parallel; on CUDA engine i sees only the i-th visible GPU); 0 = auto (one per visible CUDA "
        "device on a CUDA host, else 1)",
    )
    worker_liveness_s: float = _f(
        10.0,
        "--workers: a serving worker whose event loop answers none of the supervisor's pings (one a "
        "second) for this many seconds is killed and restarted; 0 = never",
    )
    # Security (docs/design/security.md)
    tls_cert: str = _f("", "PEM certificate (chain) of the gRPC port; with --tls-key turns TLS on")
    tls_key: str = _f("", "PEM private key of --tls-cert")
    tls_client_ca: str = _f("", "PEM CA bundle: clients must present a certificate it signed (mTLS)")
    auth_tokens_file: str = _f(
        "",
        "file of accepted bearer tokens, one per line (# comments); "
        "when set, every RPC but health and reflection needs one; SIGHUP re-reads it",
    )
    auth_tokens: str = field(
        default="",
        repr=False,
        metadata={  # env only: a flag would show in ps
            "doc": "accepted bearer tokens, comma-separated (env TS_AUTH_TOKENS only)",
            "flag": False,
        },
    )
    # onnxruntime
    device: str = _f("auto", "auto (CUDA when present, else CPU) | cpu | cuda", choices=DEVICES)
    strict_provider: bool = _f(False, "refuse to start when the requested provider is not the one in use")
    variant: str = _f(
        "auto",
        "graph variant: auto (CUDA: fp16, else optimized; CPU: the fastest, by the export's "
        "decode-step timings, of optimized, fp32 and the int8 / int4 the export gate found within "
        "its quality limits) or one name",
        choices=VARIANT_CHOICES,
    )
    intra_op_threads: int = _f(1, "onnxruntime intra-op threads per session")
    compute_workers: int = _f(2, "threads of the one compute executor (parallel batches)")
    cuda_graph: bool = _f(
        False,
        "generation decode steps replay CUDA graphs (CUDA only; off until a GPU run shows "
        "their tokens equal the plain steps', docs/design/gpu.md)",
    )
    # Default models per kind (empty: the manifest's extra.default, else the first by name)
    default_embedding_model: str = _f("", "embedding model used when a request names none")
    default_generation_model: str = _f("", "generation model used when a request names none")
    default_translation_model: str = _f("", "translation model used when a request names none")
    default_fill_mask_model: str = _f("", "fill-mask model used when a request names none")
    default_classification_model: str = _f(
        "", "classification model (reranker, classifier) used when a request names none"
    )
    default_sparse_embedding_model: str = _f("", "sparse-embedding (SPLADE) model used when a request names none")
    # Embeddings
    embed_max_batch_tokens: int = _f(
        0,
        "token budget of one encoder batch (padded: rows x longest, padding "
        "counted; packed: real tokens); 0 = by device (CPU 2048, CUDA 16384)",
    )
    embed_max_batch_size: int = _f(0, "most inputs in one embedding batch; 0 = by device (CPU 32, CUDA 256)")
    embed_max_wait_ms: float = _f(2.0, "how long a batch waits for more inputs before it closes")
    embed_max_queue: int = _f(2048, "queued inputs per embedding model; beyond it RESOURCE_EXHAUSTED")
    embed_max_inputs: int = _f(256, "most inputs in one Embed request")
    rerank_max_documents: int = _f(1000, "most documents in one rerank call (one query, N documents: N pairs)")
    classify_max_inputs: int = _f(256, "most texts or pairs in one classify call")
    embed_pack_row_tokens: int = _f(
        128,
        "encoder batches (embedding, fill-mask, the translator's encoder) run "
        "packed, several inputs per row of this many tokens, where the model directory "
        "has a packed graph; 0 = padded (docs/design/packing.md)",
    )
    encoder_layout: str = _f(
        "auto",
        "auto | packed | padded: the graph an embedding, fill-mask or classification model runs where "
        "its directory has both; auto times both (a batch at load, then the traffic) and serves the "
        "one cheaper per token (docs/design/packing.md)",
        choices=("auto", "packed", "padded"),
    )
    # Generation and translation
    gen_max_batch: int = _f(
        64,
        "most sequences decoded together by one generation model (rows of its KV cache, fewer where "
        "gen_kv_cache_bytes is short)",
    )
    gen_default_max_new_tokens: int = _f(128, "max_new_tokens when a request leaves it 0")
    gen_max_queue: int = _f(256, "queued generation requests per model; beyond it RESOURCE_EXHAUSTED")
    chat_template: str = _f(
        "",
        "MODEL=FILE[,MODEL=FILE]: a Jinja chat template for a generation model, instead of its "
        "directory's (or for one without); docs/chat.md",
    )
    tool_parser: str = _f(
        "",
        f"MODEL=PARSER[,MODEL=PARSER]: the tool-call format a generation model's replies are parsed in "
        f"({'|'.join(TOOL_PARSERS)}), instead of the one picked from its chat template; docs/chat.md",
    )
    gen_max_context: int = _f(
        0,
        "longest context (prompt + generated tokens) a generation model serves, which "
        "sizes its KV cache; 0 = the model's own max_positions",
    )
    gen_kv_cache_bytes: int = _f(
        0,
        "bytes this process's generation models may allocate for KV caches: fewer rows "
        "than gen_max_batch where short, no start where one row at the context does not "
        "fit; 0 = auto: half the free memory (CUDA device, else MemAvailable) / workers",
    )
    gen_prefix_cache: bool = _f(
        True,
        "a prompt starting with tokens already in a generation model's KV cache (a live row, or a "
        "finished one kept in free rows) prefills only the rest; off: every prompt is prefilled whole",
    )
    gen_speculate: bool = _f(
        False,
        "speculative decoding by prompt lookup for greedy requests running alone, unless a request "
        "says otherwise (`speculative`); docs/design/generation.md",
    )
    translate_max_batch: int = _f(32, "most inputs (x beams) decoded together by one translation model")
    translate_max_beam: int = _f(8, "largest beam_size accepted")
    translate_default_max_length: int = _f(0, "max target tokens when a request leaves it 0; 0 = model's")
    translate_max_inputs: int = _f(256, "most inputs (sentences) in one Translate request")
    translate_max_queue: int = _f(4096, "queued sources per translation model; beyond it RESOURCE_EXHAUSTED")
    # Inspection
    attention_max_in_flight: int = _f(
        4, "Attention calls computing at once (each holds every layer's maps); beyond it RESOURCE_EXHAUSTED"
    )

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid settings: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Human-readable reasons these settings cannot be used (empty when they can)."""
        out = []
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                out.append(f"{f.name}={getattr(self, f.name)!r} is not one of {', '.join(choices)}")
        positive = (
            "intra_op_threads",
            "compute_workers",
            "max_message_bytes",
            "grpc_max_streams",
            "embed_max_queue",
            "embed_max_inputs",
            "rerank_max_documents",
            "classify_max_inputs",
            "gen_max_batch",
            "gen_default_max_new_tokens",
            "gen_max_queue",
            "translate_max_batch",
            "translate_max_beam",
            "translate_max_inputs",
            "translate_max_queue",
            "attention_max_in_flight",
            "http_header_timeout_s",
            "http_body_timeout_s",
            "http_write_timeout_s",
            "http_max_connections",
        )
        out += [f"{n} must be > 0 (got {getattr(self, n)})" for n in positive if getattr(self, n) <= 0]
        if self.frontends < -1:
            out.append(f"frontends must be >= -1 (-1 = off, 0 = auto; got {self.frontends})")
        if self.frontends > 0 and self.workers > 1:
            out.append(
                "frontends and workers > 1 exclude each other: front ends share one engine, workers each load theirs"
            )
        if self.engines > 1 and self.frontends < 0:
            out.append("engines > 1 needs --frontends: the engines are fed by front-end processes")
        non_negative = (
            "workers",
            "engines",
            "port",
            "grace_seconds",
            "worker_liveness_s",
            "embed_max_wait_ms",
            "translate_default_max_length",
            "embed_max_batch_tokens",
            "embed_max_batch_size",
            "gen_kv_cache_bytes",
            "embed_pack_row_tokens",
        )
        out += [f"{n} must be >= 0 (got {getattr(self, n)})" for n in non_negative if getattr(self, n) < 0]
        if bool(self.tls_cert) != bool(self.tls_key):
            out.append("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca and not self.tls_cert:
            out.append("tls_client_ca (mTLS) needs TLS: give tls_cert and tls_key too")
        for by_model in (self.chat_templates, self.tool_parsers):
            try:
                by_model()
            except ValueError as e:
                out.append(str(e))
        if self.gen_max_context < 0 or self.gen_max_context == 1:
            out.append(
                f"gen_max_context must be 0 (the model's) or >= 2: a prompt token and a generated one "
                f"(got {self.gen_max_context})"
            )
        for inputs, queue in (("embed_max_inputs", "embed_max_queue"), ("translate_max_inputs", "translate_max_queue")):
            if getattr(self, inputs) > getattr(self, queue):
                out.append(
                    f"{inputs}={getattr(self, inputs)} is above {queue}={getattr(self, queue)}: a call that "
                    f"large could never be queued; lower {inputs} or raise {queue}"
                )
        if self.metrics_port < -1:
            out.append(f"metrics_port must be >= -1 (got {self.metrics_port})")
        if self.http_port < -1:
            out.append(f"http_port must be >= -1 (got {self.http_port})")
        return out

    def chat_templates(self) -> dict[str, str]:
        """chat_template ("MODEL=FILE,MODEL=FILE") -> {model: file}; ValueError when malformed."""
        return _by_model("chat_template", self.chat_template, "FILE (a model's name, a Jinja file)")

    def tool_parsers(self) -> dict[str, str]:
        """tool_parser ("MODEL=PARSER,...") -> {model: parser}; ValueError when malformed or unknown."""
        out = _by_model("tool_parser", self.tool_parser, f"PARSER (a model's name, one of {', '.join(TOOL_PARSERS)})")
        for name, parser in out.items():
            if parser not in TOOL_PARSERS:
                raise ValueError(
                    f"tool_parser {name}={parser!r}: unknown parser; expected one of {', '.join(TOOL_PARSERS)}"
                )
        return out

    @property
    def metrics_address(self) -> str:
        return self.metrics_host or self.host

    @property
    def http_address(self) -> str:
        return self.http_host or self.host

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then `TS_<FIELD>` variables, then keyword overrides."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f, raw, source=ENV_PREFIX + f.name.upper())
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_args(
        cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, prog: str = "python -m service"
    ) -> Settings:
        """Parses flags (see `add_arguments`) over `from_env`; flags not given leave env/defaults."""
        parser = argparse.ArgumentParser(prog=prog, description="transformer-serving gRPC service")
        cls.add_arguments(parser)
        args = parser.parse_args(argv)
        overrides = {k: v for k, v in vars(args).items() if v is not None}
        try:
            return cls.from_env(env, **overrides)
        except ValueError as e:
            parser.error(str(e))
            raise  # unreachable: parser.error exits

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, named after it (`--embed-max-wait-ms`); defaults are None = not given."""
        for f in fields(cls):
            if not f.metadata.get("flag", True):
                continue
            flag = "--" + f.name.replace("_", "-")
            env_name = ENV_PREFIX + f.name.upper()
            doc = f"{f.metadata['doc']} (env {env_name}; default {f.default!r})"
            if f.type in ("bool", bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=doc)
            else:
                parser.add_argument(flag, type=_type_of(f), default=None, help=doc, choices=f.metadata.get("choices"))

    def describe(self) -> dict[str, Any]:
        """The settings as a dict, secrets masked."""
        return {**dataclasses.asdict(self), "auth_tokens": "***" if self.auth_tokens else ""}


def _by_model(name: str, value: str, what: str) -> dict[str, str]:
    """MODEL=X,MODEL=X -> {model: x}; ValueError naming the setting and the malformed item."""
    out = {}
    for item in filter(None, (s.strip() for s in value.split(","))):
        model, sep, x = item.partition("=")
        if not sep or not model.strip() or not x.strip():
            raise ValueError(f"{name} {item!r}: expected MODEL={what}")
        out[model.strip()] = x.strip()
    return out


def _type_of(f: dataclasses.Field) -> type:
    return {"int": int, "float": float, "str": str, "bool": bool}.get(str(f.type), str)


def _parse(f: dataclasses.Field, raw: str, source: str) -> Any:
    kind = _type_of(f)
    if kind is bool:
        low = raw.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(f"{source}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")
    try:
        return kind(raw)
    except ValueError as e:
        raise ValueError(f"{source}={raw!r}: expected {kind.__name__}") from e


def usable_cores() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 quota (a container's CPU limit)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else max(1, min(cores, int(quota) // int(period)))
