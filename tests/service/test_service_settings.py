"""Settings (env + flags), provider choice and fallback, variant choice: no server needed."""

from __future__ import annotations

import dataclasses

import onnxruntime as ort
import pytest

from service.manifest import load_model_dir
from service.runtime import CPU, CUDA, ProviderError, Runtime
from service.settings import Settings

HAS_CUDA = CUDA in ort.get_available_providers()


def test_env_then_flags_override():
    env = {"TS_PORT": "7000", "TS_EMBED_MAX_WAIT_MS": "1.5", "TS_STRICT_PROVIDER": "yes", "TS_MODELS": "/m"}
    s = Settings.from_args(["--port", "7001", "--no-strict-provider", "--metrics-port", "0"], env=env)
    assert (s.port, s.embed_max_wait_ms, s.strict_provider, s.models, s.metrics_port) == (7001, 1.5, False, "/m", 0)
    assert Settings.from_env(env={}).gen_default_max_new_tokens == 128


@pytest.mark.parametrize(
    "env, words",
    [
        ({"TS_PORT": "abc"}, "TS_PORT='abc': expected int"),
        ({"TS_STRICT_PROVIDER": "maybe"}, "expected one of"),
        ({"TS_DEVICE": "tpu"}, "device='tpu' is not one of"),
        ({"TS_COMPUTE_WORKERS": "0"}, "compute_workers must be > 0"),
        ({"TS_EMBED_MAX_QUEUE": "100"}, "embed_max_inputs=256 is above embed_max_queue=100"),
        ({"TS_TRANSLATE_MAX_INPUTS": "5000"}, "translate_max_inputs=5000 is above translate_max_queue=4096"),
        ({"TS_CHAT_TEMPLATE": "qwen=a.jinja,b.jinja"}, "chat_template 'b.jinja': expected MODEL=FILE"),
        ({"TS_TOOL_PARSER": "qwen"}, "tool_parser 'qwen': expected MODEL=PARSER"),
        ({"TS_TOOL_PARSER": "qwen=pythonic"}, "tool_parser qwen='pythonic': unknown parser; expected one of hermes"),
    ],
)
def test_bad_settings_say_why(env, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(")):
        Settings.from_env(env=env)


PARTNERS = {
    "tls_cert": {"tls_key": "k.pem"},
    "tls_key": {"tls_cert": "c.pem"},  # settings that go together
    "tls_client_ca": {"tls_cert": "c.pem", "tls_key": "k.pem"},
}


VALID = {
    "chat_template": "tiny-gpt=chatml.jinja",
    "tool_parser": "tiny-gpt=mistral",
}  # str settings with a form of their own


def _other_value(f: dataclasses.Field):
    """A valid value of the field other than its default."""
    if f.name in VALID:
        return VALID[f.name]
    if f.metadata.get("choices"):
        return next(c for c in f.metadata["choices"] if c != f.default)
    return {"bool": lambda d: not d, "int": lambda d: d + 2, "float": lambda d: d + 0.5}.get(
        str(f.type), lambda d: "x"
    )(f.default)


@pytest.mark.parametrize("f", dataclasses.fields(Settings), ids=lambda f: f.name)
def test_every_field_has_a_doc_an_env_variable_and_a_flag(f, capsys):
    assert f.metadata.get("doc"), f.name
    value, env_name, flag = _other_value(f), "TS_" + f.name.upper(), "--" + f.name.replace("_", "-")
    raw = str(value).lower() if isinstance(value, bool) else str(value)
    assert getattr(Settings.from_env(env={env_name: raw}, **PARTNERS.get(f.name, {})), f.name) == value
    with pytest.raises(SystemExit):
        Settings.from_args(["--help"], env={})
    help_text = " ".join(capsys.readouterr().out.split())
    if f.name == "auth_tokens":  # a secret: environment only, never on a command line (ps shows it)
        assert flag + " " not in help_text
        return
    assert f"{flag} " in help_text and env_name in help_text
    partners = [arg for k, v in PARTNERS.get(f.name, {}).items() for arg in ("--" + k.replace("_", "-"), v)]
    args = [flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, raw]
    env = {env_name: str(f.default)}  # the flag wins over the environment
    assert getattr(Settings.from_args([*args, *partners], env=env), f.name) == value


@pytest.mark.skipif(HAS_CUDA, reason="tests the CPU fallback; this machine has CUDA")
def test_cuda_falls_back_to_cpu_and_says_so(tiny_models_root):
    runtime = Runtime(Settings.from_env(env={}, device="cuda"))
    try:
        assert runtime.requested_provider == CUDA
        model_dir = load_model_dir(tiny_models_root / "tiny-embed")
        session = runtime.create_session(model_dir.file(model_dir.manifest.graph("encoder").file))
        assert session.get_providers()[0] == CPU and runtime.provider == CPU and not runtime.is_cuda
    finally:
        runtime.close()
    with pytest.raises(ProviderError, match="strict_provider"):
        Runtime(Settings.from_env(env={}, device="cuda", strict_provider=True))


def test_variant_choice(tiny_models_root):
    manifest = _untimed(load_model_dir(tiny_models_root / "tiny-embed").manifest)
    cpu = Runtime(Settings.from_env(env={}, device="cpu"))
    try:
        # an encoder's int8 is served on its own only when the gate judged its quality within the limits
        assert cpu.choose_variant(_with_quality(manifest, "int8", False), "encoder") == "optimized"
        assert cpu.choose_variant(_with_quality(manifest, "int8", None), "encoder") == "optimized"
        assert cpu.choose_variant(_with_quality(manifest, "int8", True), "encoder") == "int8"
        explicit = Runtime(Settings.from_env(env={}, device="cpu", variant="int8"))
        assert explicit.choose_variant(manifest, "encoder") == "int8"
        explicit.close()
        gpt = load_model_dir(tiny_models_root / "tiny-gpt").manifest
        with pytest.raises(ValueError, match="comes only as"):
            Runtime(Settings.from_env(env={}, variant="fp16")).choose_variant(gpt, "decoder")
    finally:
        cpu.close()


def _with_quality(manifest, variant: str, ok: bool | None):
    """The manifest with `variant`'s graphs marked as passing (True) / missing (False) the quality
    gate, or carrying no quality figures (None)."""
    graphs = []
    for g in manifest.graphs:
        if g.variant == variant:
            parity = {k: v for k, v in g.parity.items() if k != "quality_ok"}
            g = dataclasses.replace(g, parity=parity if ok is None else {**parity, "quality_ok": ok})
        graphs.append(g)
    return dataclasses.replace(manifest, graphs=graphs)


def _untimed(manifest):
    """The manifest without the export's decode-step timings (auto's order without them)."""
    return dataclasses.replace(manifest, parity={k: v for k, v in manifest.parity.items() if k != "speed"})


def _timed(manifest, step_us: dict[str, float]):
    """The manifest with these decode-step timings recorded at export (export/gate/speed.py)."""
    speed = {**manifest.parity.get("speed", {}), "cpu": {"name": "a test CPU"}, "step_us": step_us}
    return dataclasses.replace(manifest, parity={**manifest.parity, "speed": speed})


def _with_variant(manifest, variant: str):
    """The manifest with a decoder graph of `variant` (its optimized graph's entry, renamed)."""
    graph = dataclasses.replace(manifest.graph("decoder", "optimized"), variant=variant, file=f"decoder.{variant}.onnx")
    return dataclasses.replace(manifest, graphs=[*(g for g in manifest.graphs if g.variant != variant), graph])


def test_auto_serves_the_fastest_variant_the_gate_admitted_by_the_exports_timings(tiny_models_root, caplog):
    gpt = load_model_dir(tiny_models_root / "tiny-gpt").manifest
    assert set(gpt.parity["speed"]["step_us"]) == {"fp32", "optimized", "int8"}  # what the export built, timed
    assert gpt.parity["speed"]["cpu"]["name"]
    both = _with_quality(_with_quality(_with_variant(_with_variant(gpt, "int8"), "int4"), "int8", True), "int4", True)
    cpu = Runtime(Settings.from_env(env={}, device="cpu"))
    try:
        times = {"fp32": 900.0, "optimized": 800.0, "int8": 500.0, "int4": 300.0}
        assert cpu.choose_variant(_timed(both, times), "decoder") == "int4"
        assert cpu.choose_variant(_timed(both, {**times, "int4": 600.0}), "decoder") == "int8"
        assert cpu.choose_variant(_timed(both, {**times, "fp32": 100.0}), "decoder") == "fp32"
        with caplog.at_level("WARNING", logger="service.runtime"):  # faster, but refused by the gate: said so
            assert cpu.choose_variant(_timed(_with_quality(both, "int4", False), times), "decoder") == "int8"
        assert "int4 not served: decoder: quality gate failed" in caplog.text
        partial = {k: v for k, v in times.items() if k != "optimized"}  # a variant without a timing: the order
        assert cpu.choose_variant(_timed(both, partial), "decoder") == "int8"
        assert cpu.choose_variant(_untimed(both), "decoder") == "int8"
    finally:
        cpu.close()


def test_auto_serves_int8_on_cpu_only_when_the_gate_judged_its_quality(tiny_models_root):
    gpt = _untimed(load_model_dir(tiny_models_root / "tiny-gpt").manifest)
    int8 = dataclasses.replace(gpt.graph("decoder", "optimized"), variant="int8", file="decoder.int8.onnx")
    gpt = dataclasses.replace(gpt, graphs=[*gpt.graphs, int8])
    cpu = Runtime(Settings.from_env(env={}, device="cpu"))
    cuda = Runtime(Settings.from_env(env={}, device="cuda"))
    try:
        assert cpu.choose_variant(_with_quality(gpt, "int8", True), "decoder") == "int8"
        assert cpu.choose_variant(_with_quality(gpt, "int8", False), "decoder") == "optimized"
        assert cpu.choose_variant(_with_quality(gpt, "int8", None), "decoder") == "optimized"  # never unmeasured
        assert cuda.choose_variant(_with_quality(gpt, "int8", True), "decoder") == "optimized"  # int8 is for CPUs
        fp16 = dataclasses.replace(int8, variant="fp16", file="decoder.fp16.onnx")
        with_fp16 = dataclasses.replace(gpt, graphs=[*gpt.graphs, fp16])
        assert cuda.choose_variant(_with_quality(with_fp16, "fp16", None), "decoder") == "fp16"
        assert cuda.choose_variant(_with_quality(with_fp16, "fp16", False), "decoder") == "optimized"
    finally:
        cpu.close()
        cuda.close()


@pytest.mark.parametrize(
    ("flags", "spins"),
    [
        ({"intra_op_threads": 1, "compute_workers": 1}, False),  # one thread: no pool to spin
        ({"intra_op_threads": 2, "compute_workers": 1}, True),  # the threads have the 2 cores
        ({"intra_op_threads": 2, "compute_workers": 2}, False),  # 4 threads on 2 cores
        ({"intra_op_threads": 2, "compute_workers": 1, "workers": 2}, False),  # two processes of 2
    ],
)
def test_intra_op_threads_spin_only_where_they_have_cores_to_themselves(monkeypatch, flags, spins):
    monkeypatch.setattr("service.settings.usable_cores", lambda: 2)
    runtime = Runtime(Settings.from_env(env={}, models="models", device="cpu", **flags))
    try:
        assert runtime.spins is spins
        entry = runtime.session_options().get_session_config_entry("session.intra_op.allow_spinning")
        assert entry == ("1" if spins else "0")
    finally:
        runtime.close()
