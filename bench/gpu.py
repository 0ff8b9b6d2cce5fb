"""`python -m bench.gpu`: the GPU path measured side by side in one run; writes a report.

On a machine with a CUDA GPU, onnxruntime-gpu and CUDA PyTorch (docs/design/gpu-benchmark.md),
each side in its own process and each phase bounded in time: PyTorch on the same GPU (decoder KV
loop, batched greedy translation, sentence-transformers), onnxruntime alone (the ceiling:
bench/gpu_ceiling.py), and the service as a real server (`--device cuda --strict-provider`:
embeddings, generation at 1, 8 and 64 streams, translation; server CPU per call or token).
Correctness is checked in the same run (greedy tokens, translations, embedding cosine). A phase
that fails is recorded with its error. Output: docs/gpu-report.md and .json (`--out`). Without a
GPU it says so and exits 0; `--device cpu --small` is a smoke check of the script.

    python -m bench.gpu [--models models] [--checkpoints checkpoints] [--out docs/gpu-report]
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
from typing import Any

from bench import gpu_service as svc
from bench.common import ROOT, ServiceProcess, conditions, run_worker
from bench.embed_throughput import load_sentences
from bench.generate_workers import PROMPTS
from bench.gpu_report import write_report

log = logging.getLogger("bench.gpu")
GPU_REPORT = ROOT / "docs" / "gpu-report"
SIZES = {  # full: the workloads, about 8 minutes on an H100; small: the CPU smoke check
    "full": dict(
        sentences=4096,
        st_batches="64,128,256,512",
        ort_batches="128,512",
        new_tokens=128,
        streams=(1, 8, 64),
        embed_in_flight=256,
        embed_per_call=64,
        embed_calls_in_flight=8,
        translate_sentences=512,
        translate_batch=128,
        per_call=8,
        translate_in_flight=16,
        max_length=64,
        budget_s=10.0,
    ),
    "small": dict(
        sentences=48,
        st_batches="16,32",
        ort_batches="16",
        new_tokens=12,
        streams=(1, 2, 4),
        embed_in_flight=8,
        embed_per_call=16,
        embed_calls_in_flight=2,
        translate_sentences=12,
        translate_batch=4,
        per_call=4,
        translate_in_flight=2,
        max_length=16,
        budget_s=0.5,
    ),
}


def missing_gpu() -> str | None:
    """Why this machine cannot run the GPU bench, or None when it can."""
    import onnxruntime as ort

    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi (no NVIDIA driver)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} offers no CUDAExecutionProvider (install onnxruntime-gpu)"
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":
        return "PyTorch sees no CUDA device"
    return None


def environment(device: str) -> dict:
    import onnxruntime as ort

    env = {
        "device": device,
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "python": sys.version.split()[0],
        "machine": conditions(),
    }
    torch = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True,
        text=True,
    ).stdout.split()
    env["torch"], env["torch_cuda"] = ([*torch, None, None])[:2]
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=name,driver_version,memory.total,compute_cap"
        row = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True).stdout
        env["gpu"] = (
            dict(
                zip(
                    ("name", "driver", "memory", "compute_capability"),
                    (f.strip() for f in row.splitlines()[0].split(",")),
                )
            )
            if row.strip()
            else None
        )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    env["commit"] = commit.stdout.strip() or None
    return env


def inputs(checkpoints: Path, sentences_file: Path | None, size: dict, tmp: Path) -> tuple[dict[str, Path], int]:
    """JSON files the sides share (generation prompts, embedding sentences, translation sources) and
    how many distinct sentences the embedding file cycles through."""
    sources = [
        json.loads(line)["source"]
        for line in (checkpoints / "tatoeba-en-fr" / "heldout.jsonl").read_text(encoding="utf-8").splitlines()
        if line
    ]
    count = size["sentences"]
    sentences = list(dict.fromkeys(load_sentences(sentences_file, count) + sources))
    files = {
        "prompts": PROMPTS,
        "sentences": (sentences * (count // len(sentences) + 1))[:count],
        "sources": sorted(sources[: size["translate_sentences"]], key=len),
    }  # the same order for both sides
    paths: dict[str, Path] = {}
    for name, items in files.items():
        paths[name] = tmp / f"{name}.json"
        paths[name].write_text(json.dumps(items), encoding="utf-8")
    return paths, len(sentences)


def torch_phases(args, size: dict, files: dict, tmp: Path) -> dict:
    """PyTorch on the device, each in its own process."""
    ckpt = args.checkpoints
    out: dict[str, Callable[[], dict]] = {}
    budget = ["--device", args.device, "--budget-s", str(size["budget_s"])]
    for dtype in ("fp16", "fp32") if args.device == "cuda" else ("fp32",):
        out[f"generate_{dtype}"] = partial(
            run_worker,
            "bench.gpu_torch",
            "generate",
            "--checkpoint",
            str(ckpt / "tinystories-gpt"),
            "--dtype",
            dtype,
            "--prompts",
            str(files["prompts"]),
            "--new-tokens",
            str(size["new_tokens"]),
            "--rows",
            str(max(size["streams"])),
            *budget,
            timeout=240,
        )
        out[f"translate_{dtype}"] = partial(
            run_worker,
            "bench.translate_workers",
            "torch",
            "--checkpoint",
            str(ckpt / "tatoeba-en-fr"),
            "--device",
            args.device,
            "--dtype",
            dtype,
            "--sentences",
            str(files["sources"]),
            "--batch",
            str(size["translate_batch"]),
            "--max-length",
            str(size["max_length"]),
            "--repeats",
            "1",
            "--threads",
            str(args.threads),
            timeout=240,
        )
    out["embed"] = lambda: run_worker(
        "bench.gpu_torch",
        "embed",
        "--sentences",
        str(files["sentences"]),
        "--batches",
        size["st_batches"],
        "--vectors",
        str(tmp / "st_fp32.npy"),
        *budget,
        timeout=240,
    )
    return out


def ceiling_phases(args, size: dict, files: dict) -> dict:
    common = ["--device", args.device, "--budget-s", str(size["budget_s"])]
    streams = ",".join(str(s) for s in (1, max(size["streams"])))
    return {
        "embed": lambda: run_worker(
            "bench.gpu_ceiling",
            "embed",
            "--model-dir",
            str(args.models / args.embed_model),
            "--sentences",
            str(files["sentences"]),
            "--batches",
            size["ort_batches"],
            *common,
            timeout=180,
        ),
        "decode": lambda: run_worker(
            "bench.gpu_ceiling",
            "decode",
            "--model-dir",
            str(args.models / args.gen_model),
            "--rows",
            streams,
            "--steps",
            str(size["new_tokens"]),
            *common,
            timeout=180,
        ),
    }


def run_phases(phases: dict, into: dict) -> None:
    """Runs each phase; a failure is recorded (with its error) and the next phase runs."""
    for name, phase in phases.items():
        started = time.perf_counter()
        try:
            into[name] = phase()
        except Exception as e:  # one broken phase must not cost the whole GPU session
            log.exception("phase %s failed", name)
            into[name] = {"error": f"{type(e).__name__}: {str(e)[-1500:]}"}
        if isinstance(into[name], dict):
            into[name]["phase_seconds"] = round(time.perf_counter() - started, 1)
        log.info("phase %s done in %.1f s", name, time.perf_counter() - started)


def server_flags(args, size: dict, variant: str) -> list[str]:
    # Room for the workloads' rows (64 streams, translation calls in flight); the rest: the settings' defaults.
    flags = [
        "--device",
        args.device,
        "--variant",
        variant,
        "--gen-max-batch",
        str(max(size["streams"])),
        "--translate-max-batch",
        str(size["per_call"] * size["translate_in_flight"]),
    ]
    # fp32 ("optimized"): the decoder's attention runs on the CPU (onnxruntime's CUDA GroupQueryAttention
    # takes fp16/bf16 only), which --strict-provider refuses; that server checks the unbound path's tokens.
    strict = args.device == "cuda" and variant != "optimized"
    return flags + (["--strict-provider"] if strict else []) + args.server_flag


def service_runs(args, size: dict, files: dict, tmp: Path) -> dict:
    """Two real servers in turn: the default variant (fp16 on CUDA) for every client workload,
    then the fp32 graphs ("optimized") for the fp32 token check."""

    def workloads(server: ServiceProcess) -> svc.Workloads:
        return svc.Workloads(server.address, server.proc.pid, size, files, tmp / "st_fp32.npy")

    def every_workload(server: ServiceProcess) -> dict:
        out: dict = {}
        run_phases(workloads(server).phases(), out)
        return out

    def graph_streams(server: ServiceProcess) -> dict:
        out: dict = {}
        w = workloads(server)
        run_phases({f"generate_{n}_streams": partial(w.streams, n) for n in size["streams"]}, out)
        return out

    return {
        "service": lambda: serve(args, size, "auto", every_workload),
        "service_fp32": lambda: serve(args, size, "optimized", lambda server: workloads(server).alone()),
        # the default variant's decode steps replaying CUDA graphs (setting cuda_graph), CUDA only
        **(
            {"service_cuda_graph": lambda: serve(args, size, "auto", graph_streams, ("--cuda-graph",))}
            if args.device == "cuda"
            else {}
        ),
    }


def serve(args, size: dict, variant: str, body, extra: tuple[str, ...] = ()) -> dict:
    server = ServiceProcess(args.models, server_flags(args, size, variant) + list(extra))
    try:
        return body(server)
    finally:
        server.stop()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke check of the script")
    p.add_argument("--small", action="store_true", help="small sizes (the CPU smoke check)")
    p.add_argument("--models", type=Path, default=Path("models"), help="model directories (make models)")
    p.add_argument("--checkpoints", type=Path, default=Path("checkpoints"), help="the shipped checkpoints")
    p.add_argument(
        "--sentences",
        type=Path,
        help="embedding sentences: STS-B TSV or one per line (default: "
        "STS-B beside the checkout, else tests/data; the translator's held-out sources are added)",
    )
    p.add_argument("--embed-model", default="all-minilm-l6-v2")
    p.add_argument("--gen-model", default="tinystories-gpt")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads of the translation side")
    p.add_argument("--out", type=Path, default=GPU_REPORT, help="report path without suffix (.md and .json)")
    p.add_argument("--server-flag", action="append", default=[], help="extra `python -m service` flag")
    p.add_argument("--budget-s", type=float, help="seconds per measurement (default: 10, or 0.5 with --small)")
    args = p.parse_args(argv)
    if args.device == "cpu" and args.out.resolve() == GPU_REPORT.resolve():
        p.error("--device cpu writes no GPU report: give --out elsewhere (e.g. /tmp/gpu-smoke)")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device == "cuda" and (reason := missing_gpu()):
        sys.stdout.write(f"bench.gpu: no GPU to measure here ({reason}); nothing measured, no report written.\n")
        return 0
    size = dict(SIZES["small" if args.small else "full"])
    if args.budget_s is not None:
        size["budget_s"] = args.budget_s
    started = time.perf_counter()
    report: dict[str, Any] = {
        "environment": environment(args.device),
        "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in size.items()},
    }
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        files, report["sizes"]["distinct_sentences"] = inputs(args.checkpoints, args.sentences, size, Path(tmp))
        report["torch"], report["ceiling"] = {}, {}
        report["server_flags"] = {v: server_flags(args, size, v) for v in ("auto", "optimized")}
        run_phases(torch_phases(args, size, files, Path(tmp)), report["torch"])
        run_phases(ceiling_phases(args, size, files), report["ceiling"])
        run_phases(service_runs(args, size, files, Path(tmp)), report)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    paths = write_report(report, args.out, args.checkpoints)
    sys.stdout.write("bench.gpu: wrote " + ", ".join(str(p) for p in paths) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
