"""Converted checkpoints at the sizes users serve, side by side with their source libraries.

Random-weight folders built here (bench/converted_folders.py: GPT-2 small, a SmolLM-135M-shaped
Llama, a BERT-base sentence-transformers folder, a 4-layer Qwen3-Embedding-shaped decoder embedder)
go through the real `python -m export convert`.
- generation: a real `python -m service` per variant (tokens/s of 1 and `--streams` streams, time
  to first token, server CPU per token) vs transformers' greedy `generate` with its cache, fp32;
- embedding: the service's Embed sentences/s (16 concurrent clients) vs sentence-transformers and
  onnxruntime alone on the served graph (the ceiling); min cosine.
Each side runs in its own process (bench/converted_workers.py) with `--threads` threads; sides
alternate `--rounds` times and ratios are per round, median quoted. `--work DIR` keeps the folders
and model directories for a later run (conversion takes minutes per model).

    python -m bench.converted [--only gpt2,llama,bert,qwen3e] [--rounds 2] [--new-tokens 64] [--threads 1] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.common import ServiceProcess, conditions, run_worker, summary
from bench.converted_folders import sentences

log = logging.getLogger("bench.converted")

WORKERS = "bench.converted_workers"
KINDS = {"gpt2": "generation", "llama": "generation", "bert": "embedding", "qwen3e": "embedding"}
NAMES = {"gpt2": "gpt2-small", "llama": "llama-135m", "bert": "bert-base-st", "qwen3e": "qwen3-embedding-4l"}
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpu_summary() -> dict:
    """lscpu's model name and which of the wide-vector / int8 / AMX instruction sets it reports."""
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("Flags", "").split())
    return {
        "model_name": fields.get("Model name", ""),
        "cpus": fields.get("CPU(s)", ""),
        "flags": {f: f in flags for f in FLAGS},
    }


def prepare(key: str, work: Path, args) -> dict:
    """Builds the folder and converts it into work/key/models/NAME, or reuses what an earlier run with
    the same --work left there; -> what happened (never raises)."""
    folder, models, record = work / key / "hf", work / key / "models", work / key / "prepared.json"
    if record.is_file() and (models / NAMES[key] / "model.json").is_file():
        return {**json.loads(record.read_text()), "reused": str(record), "paths": {"folder": folder, "models": models}}
    out: dict = {"name": NAMES[key]}
    try:
        shutil.rmtree(work / key, ignore_errors=True)
        out["folder"] = run_worker(WORKERS, "folder", "--folder", str(folder), "--name", key)
        out["conversion"] = run_worker(
            WORKERS,
            "convert",
            "--folder",
            str(folder),
            "--models",
            str(models),
            "--name",
            NAMES[key],
            "--variants",
            args.variants,
            "--context",
            str(args.context if KINDS[key] == "generation" else 0),
            timeout=3600,
        )
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        out["error"] = str(e)[-3000:]
        return out
    if out["conversion"]["rc"] != 0:
        out["error"] = f"python -m export convert exited {out['conversion']['rc']}"
        return out
    out["conversion"].update(graphs(models / NAMES[key]))
    record.write_text(json.dumps(out, indent=2))
    return {**out, "paths": {"folder": folder, "models": models}}


def graphs(model_dir: Path) -> dict:
    """The built variants of the model directory, their sizes and gate verdicts (manifest figures)."""
    manifest = json.loads((model_dir / "model.json").read_text())
    built = {}
    for g in manifest["graphs"]:
        figures = g.get("parity", {})
        built[g["variant"] if g["role"] in ("decoder", "encoder") else f"{g['role']}/{g['variant']}"] = {
            "mb": round((model_dir / g["file"]).stat().st_size / 2**20),
            **{k: figures[k] for k in ("quality_ok", "build_seconds", "int8_method") if k in figures},
        }
    auto = "int8" if built.get("int8", {}).get("quality_ok") else "optimized" if "optimized" in built else "fp32"
    return {
        "graphs": built,
        "auto_serves": auto,
        "max_input_tokens": manifest["max_input_tokens"],
        "max_output_tokens": manifest.get("max_output_tokens"),
        "directory_mb": round(sum(f.stat().st_size for f in model_dir.iterdir()) / 2**20),
    }


def served_variants(prepared: dict, args) -> list[str]:
    """The --serve variants the conversion built, asked for by name (`--variant`), so a gate's verdict
    on random weights does not hide a variant's speed; `auto_serves` says what a default server picks."""
    return [v for v in args.serve.split(",") if v in prepared["conversion"]["graphs"]]


def service_round(models: Path, variant: str, worker_args: list[str], args) -> dict:
    flags = [
        "--intra-op-threads",
        str(args.threads),
        "--compute-workers",
        "1",
        "--variant",
        variant,
        "--no-verify-hashes",
        "--gen-max-batch",
        str(max(16, args.streams)),
    ]
    service = ServiceProcess(models, flags)
    try:
        return run_worker(
            WORKERS, *worker_args, "--address", service.address, "--server-pid", str(service.proc.pid), timeout=1800
        )
    finally:
        service.stop()


def generation_round(prepared: dict, variants: list[str], flip: bool, args) -> dict:
    common = ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
    steps: list[tuple[str, Callable[[], dict]]] = [
        (
            "hf",
            lambda: run_worker(
                WORKERS,
                "hf-generate",
                "--folder",
                str(prepared["paths"]["folder"]),
                "--threads",
                str(args.threads),
                "--batch",
                str(args.streams),
                *common,
                timeout=1800,
            ),
        )
    ]
    steps += [
        (
            v,
            partial(
                service_round,
                prepared["paths"]["models"],
                v,
                ["gen-client", "--streams", str(args.streams), *common],
                args,
            ),
        )
        for v in variants
    ]
    return {name: run() for name, run in (steps[::-1] if flip else steps)}


def embedding_round(prepared: dict, variants: list[str], flip: bool, texts: Path, tmp: Path, args) -> dict:
    common = ["--sentences", str(texts), "--threads", str(args.threads)]
    model_dir = prepared["paths"]["models"] / prepared["name"]
    steps: list[tuple[str, Callable[[], dict]]] = [
        (
            "st",
            lambda: run_worker(
                WORKERS,
                "st-embed",
                "--folder",
                str(prepared["paths"]["folder"]),
                *common,
                "--vectors",
                str(tmp / "st.npy"),
                timeout=1800,
            ),
        )
    ]
    for v in variants:
        steps.append(
            (
                f"ort/{v}",
                partial(
                    run_worker,
                    WORKERS,
                    "ort-embed",
                    "--model-dir",
                    str(model_dir),
                    "--variant",
                    v,
                    *common,
                    "--vectors",
                    str(tmp / f"ort-{v}.npy"),
                    timeout=1800,
                ),
            )
        )
        steps.append(
            (
                v,
                partial(
                    service_round,
                    prepared["paths"]["models"],
                    v,
                    ["embed-client", "--sentences", str(texts), "--vectors", str(tmp / f"service-{v}.npy")],
                    args,
                ),
            )
        )
    return {name: run() for name, run in (steps[::-1] if flip else steps)}


def prefix(a: list[int], b: list[int]) -> int:
    """How many leading greedy tokens two runs share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def med(worker: dict, key: str) -> float:
    """A worker's median over its repeats (the upper one of two)."""
    return sorted(worker[key])[len(worker[key]) // 2]


def generation_report(rounds: list[dict], variants: list[str]) -> dict:
    hf = [r["hf"] for r in rounds]
    batch = hf[0]["batch"]
    out = {
        "transformers": {
            "one_stream_tokens_per_s": summary([med(r, "one_tokens_per_s") for r in hf]),
            "ttft_ms": summary([med(r, "ttft_ms") for r in hf], 1),
            "one_stream_cpu_ms_per_token": summary([med(r, "one_cpu_ms_per_token") for r in hf]),
            f"batch_{batch}_tokens_per_s": summary([r["batch_tokens_per_s"] for r in hf]),
            f"batch_{batch}_cpu_ms_per_token": summary([r["batch_cpu_ms_per_token"] for r in hf]),
            "prompt_tokens": hf[0]["prompt_tokens"],
            "new_tokens": len(hf[0]["tokens"]),
        }
    }
    for v in variants:
        out[f"service_{v}"] = service_figures(rounds, v)
    return out


def service_figures(rounds: list[dict], v: str) -> dict:
    """One served variant's figures, and its ratios to transformers taken round by round."""
    sv = [r[v] for r in rounds]
    n = sv[0]["streams"]

    def ratio(fn) -> dict:
        return summary([fn(r[v], r["hf"]) for r in rounds])

    return {
        "one_stream_tokens_per_s": summary([med(r, "one_tokens_per_s") for r in sv]),
        "ttft_ms": summary([med(r, "ttft_ms") for r in sv], 1),
        "one_stream_server_cpu_ms_per_token": summary([med(r, "one_cpu_ms_per_token") for r in sv]),
        f"{n}_streams_tokens_per_s": summary([med(r, "many_tokens_per_s") for r in sv]),
        f"{n}_streams_ttft_ms": summary([med(r, "many_ttft_ms") for r in sv], 1),
        f"{n}_streams_server_cpu_ms_per_token": summary([med(r, "many_cpu_ms_per_token") for r in sv]),
        "same_tokens_as_transformers": all(r[v]["tokens"] == r["hf"]["tokens"] for r in rounds),
        "same_prefix_tokens": min(prefix(r[v]["tokens"], r["hf"]["tokens"]) for r in rounds),
        "ratios_per_round_median": {
            "one_stream_vs_transformers": ratio(lambda s, h: med(s, "one_tokens_per_s") / med(h, "one_tokens_per_s")),
            "streams_vs_transformers_one": ratio(lambda s, h: med(s, "many_tokens_per_s") / med(h, "one_tokens_per_s")),
            "streams_vs_transformers_batch": ratio(lambda s, h: med(s, "many_tokens_per_s") / h["batch_tokens_per_s"]),
            "ttft_transformers_over_service": ratio(lambda s, h: med(h, "ttft_ms") / med(s, "ttft_ms")),
            "cpu_per_token_transformers_over_service": ratio(
                lambda s, h: med(h, "one_cpu_ms_per_token") / med(s, "one_cpu_ms_per_token")
            ),
            "streams_cpu_per_token_transformers_batch_over_service": ratio(
                lambda s, h: h["batch_cpu_ms_per_token"] / med(s, "many_cpu_ms_per_token")
            ),
        },
    }


def cosines(a, b) -> float:
    import numpy as np

    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def embedding_report(rounds: list[dict], variants: list[str], tmp: Path) -> dict:
    import numpy as np

    st = [r["st"] for r in rounds]
    out = {
        "sentence_transformers": {
            "sentences_per_s": summary([r["sentences_per_s"] for r in st]),
            "cpu_ms_per_sentence": summary([r["cpu_ms_per_sentence"] for r in st]),
            "batch": st[0]["batch"],
            "max_seq_length": st[0]["max_seq_length"],
        }
    }
    reference = np.load(tmp / "st.npy")
    for v in variants:
        sv, ort = [r[v] for r in rounds], [r[f"ort/{v}"] for r in rounds]
        out[f"service_{v}"] = {
            "sentences_per_s": summary([r["sentences_per_s"] for r in sv]),
            "server_cpu_ms_per_sentence": summary([r["server_cpu_ms_per_sentence"] for r in sv]),
            "clients": sv[0]["clients"],
            "onnxruntime_alone_sentences_per_s": summary([r["sentences_per_s"] for r in ort]),
            "onnxruntime_alone_cpu_ms_per_sentence": summary([r["cpu_ms_per_sentence"] for r in ort]),
            "onnxruntime_alone_packed": ort[0]["packed"],
            "min_cosine_vs_sentence_transformers": round(cosines(np.load(tmp / f"service-{v}.npy"), reference), 6),
            "ratios_per_round_median": {
                "service_vs_sentence_transformers": summary(
                    [r[v]["sentences_per_s"] / r["st"]["sentences_per_s"] for r in rounds]
                ),
                "onnxruntime_vs_sentence_transformers": summary(
                    [r[f"ort/{v}"]["sentences_per_s"] / r["st"]["sentences_per_s"] for r in rounds]
                ),
                "service_vs_onnxruntime": summary(
                    [r[v]["sentences_per_s"] / r[f"ort/{v}"]["sentences_per_s"] for r in rounds]
                ),
            },
        }
    return out


def measure(key: str, prepared: dict, tmp: Path, args) -> dict:
    variants = served_variants(prepared, args)
    if KINDS[key] == "embedding":
        texts = tmp / "sentences.json"
        texts.write_text(json.dumps(sentences(args.sentences)))
        rounds = [embedding_round(prepared, variants, i % 2 == 1, texts, tmp, args) for i in range(args.rounds)]
        return {"sentences": args.sentences, **embedding_report(rounds, variants, tmp)}
    rounds = [generation_round(prepared, variants, i % 2 == 1, args) for i in range(args.rounds)]
    return generation_report(rounds, variants)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.converted", description=__doc__.split("\n")[0])
    p.add_argument("--only", default="gpt2,llama,bert", help="which of gpt2, llama, bert, qwen3e")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (fresh processes each)")
    p.add_argument("--repeats", type=int, default=2, help="measured generations per worker (after a warm-up)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--streams", type=int, default=8, help="concurrent streams; transformers' batch size")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads = torch threads")
    p.add_argument("--variants", default="optimized,int8,int4", help="built by the conversion")
    p.add_argument("--serve", default="optimized,int8,int4", help="variants the service is measured on (where built)")
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the folders and model directories here and "
        "reuse them when run again (default: a temporary folder, removed)",
    )
    p.add_argument("--context", type=int, default=0, help="decoders' served context (0: the converter's default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    before, started = conditions(), time.perf_counter()
    result: dict = {
        "command": "python -m bench.converted " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_summary(),
        "threads": args.threads,
        "rounds": args.rounds,
        "new_tokens": args.new_tokens,
        "streams": args.streams,
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-converted-") as tmp:
        work = args.work.resolve() if args.work else Path(tmp)
        for key in args.only.split(","):
            log.info("%s: building and converting in %s", key, work / key)
            prepared = prepare(key, work, args)
            entry = {k: v for k, v in prepared.items() if k != "paths"}
            if "error" not in prepared:
                log.info("%s: measuring (%s)", key, ", ".join(served_variants(prepared, args)))
                try:
                    entry.update(measure(key, prepared, Path(tmp), args))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    entry["error"] = str(e)[-3000:]
            result["models"][key] = entry
            sys.stderr.write(json.dumps({key: entry}, default=str) + "\n")
    result["minutes"] = round((time.perf_counter() - started) / 60, 1)
    result["conditions"] = {"before": before, "after": conditions()}
    sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
