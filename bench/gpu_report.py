"""bench.gpu's report: the correctness verdicts and the side-by-side tables, as Markdown and JSON.

`write_report(report, out, checkpoints)` adds `correctness` and `summary` to the raw figures,
writes out.json (everything, tokens included) and out.md (the tables). Generation tokens are
compared without a trailing EOS (the service may or may not hand it back); translations are
compared as text, PyTorch's token ids decoded by the checkpoint's tokenizer as the service does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tokenizers import Tokenizer

TARGETS = {
    "generate_1_stream": 10.0,
    "generate_64_streams": 3.0,
    "embed_64_per_call": 2.0,
    "embed_1_per_call_sentences_per_s": 10000.0,
    "translate": 2.0,
}


def _trim(tokens: list[int], eos: int) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens


def _agreement(got: list[list[int]], ref: list[list[int]], eos: int) -> dict:
    """Identical sequences, and the mean share of each reference the other matches from the start."""
    shares, same = [], 0
    for g, r in zip(got, ref):
        g, r = _trim(g, eos), _trim(r, eos)
        prefix = next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
        shares.append(prefix / max(1, len(g), len(r)))
        same += g == r
    return {"identical": same, "of": len(shares), "mean_prefix_share": round(sum(shares) / max(1, len(shares)), 4)}


def _get(tree: dict, *keys):
    """tree[k1][k2]...; None where a key is missing or a phase on the way (or the last) failed."""
    for key in keys:
        if not isinstance(tree, dict) or key not in tree or "error" in tree:
            return None
        tree = tree[key]
    return None if isinstance(tree, dict) and "error" in tree else tree


def correctness(report: dict, checkpoints: Path) -> dict:
    eos = json.loads((checkpoints / "tinystories-gpt" / "config.json").read_text())["special_tokens"]["eos"]
    out = {}
    variant = next(
        (m["variant"] for m in _get(report, "service", "models", "models") or [] if m["kind"] == "generation"), "fp16"
    )
    served_dtype = "fp16" if variant == "fp16" else "fp32"  # int8 (CPU) is compared with fp32: it may drift
    for name, served, dtype in (
        (f"generate_{variant}", "service", served_dtype),
        ("generate_fp32", "service_fp32", "fp32"),
    ):
        alone = _get(report, served, "generate_alone_and_together", "alone") or _get(report, served, "alone")
        together = _get(report, served, "generate_alone_and_together", "together") or _get(report, served, "together")
        ref = _get(report, "torch", f"generate_{dtype}", "tokens")
        if alone and ref:
            out[f"{name}_service_vs_pytorch"] = _agreement(alone, ref, eos)
        if alone and together:
            out[f"{name}_concurrent_vs_alone"] = _agreement(together, alone, eos)
    texts = _get(report, "service", "translate", "texts")
    tok = Tokenizer.from_file(str(checkpoints / "tatoeba-en-fr" / "tokenizer.json"))
    for dtype in ("fp16", "fp32"):
        ref = _get(report, "torch", f"translate_{dtype}", "tokens")
        if texts and ref:
            decoded = [tok.decode(t, skip_special_tokens=True) for t in ref]
            out[f"translate_service_vs_pytorch_{dtype}"] = {
                "identical": sum(a == b for a, b in zip(texts, decoded)),
                "of": len(decoded),
            }
    cos = _get(report, "service", "embed_single", "min_cosine_vs_st_fp32")
    if cos is not None:
        out["embed_min_cosine_vs_st_fp32"] = cos
    return out


def summary(report: dict) -> dict:
    """The issue's ratios against PyTorch on the same device (the faster PyTorch precision)."""

    def best(*values):
        values = [v for v in values if v]
        return max(values) if values else None

    def ratio(a, b):
        return round(a / b, 2) if a and b else None

    streams = report.get("sizes", {}).get("streams", [1, 8, 64])
    torch_one = best(*(_get(report, "torch", f"generate_{d}", "one_stream_tokens_per_s") for d in ("fp16", "fp32")))
    torch_many = best(*(_get(report, "torch", f"generate_{d}", "batch_tokens_per_s") for d in ("fp16", "fp32")))
    st = _get(report, "torch", "embed", "best_sentences_per_s")
    torch_tr = best(
        *(
            _get(report, "torch", f"translate_{d}", "sentences_per_s")
            and max(_get(report, "torch", f"translate_{d}", "sentences_per_s"))
            for d in ("fp16", "fp32")
        )
    )
    one = _get(report, "service", f"generate_{streams[0]}_streams", "tokens_per_s")
    many = _get(report, "service", f"generate_{streams[-1]}_streams", "tokens_per_s")
    single = _get(report, "service", "embed_single", "sentences_per_s")
    batched = _get(report, "service", "embed_batched", "sentences_per_s")
    tr = _get(report, "service", "translate", "sentences_per_s")
    return {
        "generate_1_stream": {"service": one, "pytorch": torch_one, "ratio": ratio(one, torch_one)},
        f"generate_{streams[-1]}_streams": {"service": many, "pytorch": torch_many, "ratio": ratio(many, torch_many)},
        "embed_64_per_call": {"service": batched, "pytorch": st, "ratio": ratio(batched, st)},
        "embed_1_per_call_sentences_per_s": {"service": single, "pytorch": st, "ratio": ratio(single, st)},
        "translate": {"service": tr, "pytorch": torch_tr, "ratio": ratio(tr, torch_tr)},
    }


def markdown(report: dict) -> str:
    env, gpu = report["environment"], report["environment"].get("gpu") or {}
    lines = [
        f"# GPU report: the service against PyTorch on the same {env['device'].upper()}",
        "",
        f"Written by `python -m bench.gpu` on {report['written']} in {report['total_seconds']} s; every figure "
        "below comes from that one run (raw figures and tokens: the .json beside this file).",
        "",
        "| | |",
        "|---|---|",
        f"| GPU | {gpu.get('name', '-')} ({gpu.get('memory', '-')}), driver {gpu.get('driver', '-')} |",
        f"| onnxruntime | {env['onnxruntime']} ({', '.join(env['providers'])}) |",
        f"| torch | {env['torch']} (CUDA {env['torch_cuda']}) |",
        f"| CPU | {env['machine']['cpu']} x {env['machine']['cpus']} |",
        f"| served | {_served(report)} |",
        f"| server flags | `{' '.join((report.get('server_flags') or {}).get('auto', []))}` |",
        f"| commit | {env.get('commit') or '-'} |",
        "",
        "## Correctness",
        "",
        "| check | result |",
        "|---|---|",
    ]
    for key, value in report["correctness"].items():
        shown = f"{value['identical']} of {value['of']} identical" if isinstance(value, dict) else f"{value:.6f}"
        if isinstance(value, dict) and "mean_prefix_share" in value:
            shown += f" (mean shared prefix {value['mean_prefix_share']:.0%})"
        lines.append(f"| {key.replace('_', ' ')} | {shown} |")
    lines += [
        "",
        "## Against the targets (PyTorch: its faster precision)",
        "",
        "| workload | service | PyTorch | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for key, row in report["summary"].items():
        target = TARGETS.get(key, TARGETS["generate_64_streams"] if key.startswith("generate_") else None)
        lines.append(f"| {key.replace('_', ' ')} | {row['service']} | {row['pytorch']} | {row['ratio']} | {target} |")
    lines += ["", "## Every side", "", "| side | workload | figure |", "|---|---|---|"]
    lines += [f"| {side} | {what} | {figure} |" for side, what, figure in _rows(report)]
    lines += [
        "",
        "## Generation through the service",
        "",
        "| streams | tokens/s | TTFT p50 / p99 ms | inter-token p50 / p99 ms | server CPU ms/token |",
        "|---|---|---|---|---|",
    ]
    for n, server in ((n, s) for s in ("service", "service_cuda_graph") for n in report["sizes"]["streams"]):
        g = _get(report, server, f"generate_{n}_streams") or {}
        if g:
            lines.append(
                f"| {n}{' (CUDA graphs)' if server != 'service' else ''} | {g['tokens_per_s']} | "
                f"{g['ttft_ms']['p50']} / {g['ttft_ms']['p99']} | "
                f"{g['inter_token_ms']['p50']} / {g['inter_token_ms']['p99']} | {g['server_cpu_ms_per_token']} |"
            )
    errors = [f"- {where}: {e}" for where, e in _errors(report)]
    lines += [
        "",
        "## Phases that failed",
        "",
        *(errors or ["none"]),
        "",
        "## Sizes",
        "",
        ", ".join(f"{k} {v}" for k, v in report["sizes"].items()),
        "",
    ]
    return "\n".join(lines)


def _served(report: dict) -> str:
    models = _get(report, "service", "models", "models") or []
    return ", ".join(f"{m['name']} {m['variant']} on {m['provider']}" for m in models) or "-"


def _rows(report: dict) -> list[tuple[str, str, str]]:
    """(side, workload, figure) for every throughput figure measured."""
    rows = []
    for d in ("fp16", "fp32"):
        g = _get(report, "torch", f"generate_{d}") or {}
        if g:
            rows += [
                (f"PyTorch {d}", "KV-cache loop, 1 stream", f"{g['one_stream_tokens_per_s']} tokens/s"),
                (f"PyTorch {d}", f"static batch of {g['batch_rows']}", f"{g['batch_tokens_per_s']} tokens/s"),
            ]
        t = _get(report, "torch", f"translate_{d}") or {}
        if t:
            rows.append((f"PyTorch {d}", "batched greedy translation", f"{max(t['sentences_per_s'])} sentences/s"))
    e = _get(report, "torch", "embed") or {}
    rows += [
        ("sentence-transformers" + (" fp16" if e.get("fp16") else ""), f"batch {b}", f"{v} sentences/s")
        for b, v in e.get("sentences_per_s_by_batch", {}).items()
    ]
    for key, label in (("embed_single", "embed, 1 input per call"), ("embed_batched", "embed, inputs per call")):
        f = _get(report, "service", key) or {}
        if f:
            rows.append(
                (
                    "service",
                    f"{label} ({f.get('per_call', 1)}/call, {f['in_flight']} in flight)",
                    f"{f['sentences_per_s']} sentences/s, server CPU {f['server_cpu_ms_per_call']} ms/call",
                )
            )
    t = _get(report, "service", "translate") or {}
    if t:
        rows.append(
            (
                "service",
                f"translation ({t['per_call']}/call, {t['in_flight']} in flight)",
                f"{t['sentences_per_s']} sentences/s, server CPU {t['server_cpu_ms_per_call']} ms/call",
            )
        )
    c = _get(report, "ceiling", "embed") or {}
    rows += [
        (f"onnxruntime alone {c['variant']}", f"encoder, sorted batches of {b}", f"{v} sentences/s")
        for b, v in c.get("sentences_per_s_by_batch", {}).items()
    ]
    c = _get(report, "ceiling", "decode") or {}
    rows += [
        (
            f"onnxruntime alone {c['variant']}",
            f"bound decode loop, {r} rows",
            f"{v['tokens_per_s']} tokens/s ({v['us_per_step']} us/step)",
        )
        for r, v in c.get("by_rows", {}).items()
    ]
    return rows


def _errors(report: dict, where: str = "") -> list[tuple[str, str]]:
    if not isinstance(report, dict):
        return []
    if "error" in report:
        return [(where, report["error"].splitlines()[-1] if report["error"] else "")]
    return [e for k, v in report.items() for e in _errors(v, f"{where}/{k}" if where else k)]


def write_report(report: dict, out: Path, checkpoints: Path) -> list[Path]:
    report["written"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report["correctness"] = correctness(report, checkpoints)
    report["summary"] = summary(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    md, js = out.with_suffix(".md"), out.with_suffix(".json")
    js.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md.write_text(markdown(report), encoding="utf-8")
    return [md, js]
