"""lm-evaluation-harness against the service: its `local-completions` model on the local tasks of
bench/lm_eval/tasks (multiple choice and rolling perplexity), through a real `python -m service`.

    pip install -e '.[eval]'   # lm-eval 0.4.13, client side only
    python -m bench.lm_eval --models models [--model tinystories-gpt] [--limit N]

Runs the `lm_eval` command line docs/api.md shows (remote tokenizer: the server's /tokenize),
then recomputes the perplexity task without the service: the same rolling windows, each scored by
the model's decoder graph straight from onnxruntime. Prints one JSON object (figures, the command,
wall time, the machine's conditions).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import ROOT, ServiceProcess, conditions, emit

TASKS = "tinystories_next_sentence,tinystories_perplexity"
PERPLEXITY_DATA = Path(__file__).resolve().parent / "tasks" / "data" / "perplexity.jsonl"


def lm_eval_command(url: str, model: str, out: Path, args) -> list[str]:
    model_args = (
        f"model={model},base_url={url}/v1/completions,tokenizer_backend=remote,max_length={args.max_length},"
        f"num_concurrent={args.concurrent}"
    )
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--batch_size",
        str(args.batch_size),
        "--tasks",
        TASKS,
        "--include_path",
        "bench/lm_eval/tasks",
        "--output_path",
        str(out),
    ]
    return cmd + (["--limit", str(args.limit)] if args.limit else [])


def run_lm_eval(cmd: list[str]) -> tuple[dict, float]:
    started = time.perf_counter()
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"lm_eval exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    out = Path(cmd[cmd.index("--output_path") + 1])
    (path,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    return json.loads(Path(path).read_text())["results"], seconds


def reference_perplexity(model_dir: Path, variant: str, max_length: int, limit: int | None) -> dict:
    """The perplexity task's figures recomputed without the service: lm-eval's own rolling windows
    (as local-completions builds them for max_length) over the stories' tokens, each window's
    continuation scored by the decoder graph in onnxruntime."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    from tokenizers import Tokenizer

    from export.gate.parity import forced_logits, log_softmax, onnx_step, session
    from service.manifest import load_model_dir

    md = load_model_dir(model_dir)
    m = md.manifest
    tok = Tokenizer.from_file(str(md.file(m.tokenizer["file"])))
    step = onnx_step(
        session(md.file(m.graph("decoder", variant).file)), max_length=int(m.architecture["max_positions"])
    )
    prefix = tok.encode("<|endoftext|>", add_special_tokens=False).ids[0]  # what the remote tokenizer gives
    docs = [json.loads(line)["text"] for line in PERPLEXITY_DATA.read_text(encoding="utf-8").splitlines()]
    loglikelihood, words, chars = 0.0, 0, 0
    for doc in docs[:limit] if limit else docs:
        ids = tok.encode(doc, add_special_tokens=False).ids
        for context, continuation in map(
            make_disjoint_window,
            get_rolling_token_windows(token_list=ids, prefix_token=prefix, max_seq_len=max_length - 2, context_len=1),
        ):
            window = (context + continuation)[-(max_length - 1) :]
            lp = log_softmax(forced_logits(step, window))  # (T-1, V), predicting window[1:]
            rows = np.arange(len(window) - 1 - len(continuation), len(window) - 1)
            loglikelihood += float(lp[rows, continuation].sum())
        words += len(re.split(r"\s+", doc))
        chars += len(doc.encode("utf-8"))
    return {
        "variant": variant,
        "word_perplexity": math.exp(-loglikelihood / words),
        "byte_perplexity": math.exp(-loglikelihood / chars),
        "bits_per_byte": -loglikelihood / chars / math.log(2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models", help="folder of model directories")
    parser.add_argument("--model", default="tinystories-gpt")
    parser.add_argument("--limit", type=int, default=0, help="documents per task (0: all)")
    parser.add_argument("--max-length", type=int, default=256, help="lm-eval's max_length: the model's context")
    parser.add_argument("--batch-size", type=int, default=8, help="requests per completions call")
    parser.add_argument("--concurrent", type=int, default=2, help="calls in flight")
    parser.add_argument("--threads", type=int, default=1, help="the server's onnxruntime intra-op threads")
    parser.add_argument("--variant", default="optimized", help="the decoder graph served and recomputed")
    args = parser.parse_args()
    before = conditions()
    server = ServiceProcess(args.models, ["--intra-op-threads", str(args.threads), "--variant", args.variant])
    try:
        with tempfile.TemporaryDirectory() as out:
            cmd = lm_eval_command(server.http_url, args.model, Path(out), args)
            results, seconds = run_lm_eval(cmd)
    finally:
        server.stop()
    reference = reference_perplexity(args.models / args.model, args.variant, args.max_length, args.limit or None)
    served = results["tinystories_perplexity"]
    emit(
        {
            "model": args.model,
            "lm_eval": results,
            "lm_eval_seconds": round(seconds, 1),
            "reference_perplexity": reference,
            "word_perplexity_rel_diff": abs(served["word_perplexity,none"] / reference["word_perplexity"] - 1),
            "command": " ".join(["lm_eval", *cmd[3:]]).replace(server.http_url, "http://127.0.0.1:8080"),
            "conditions": {"before": before, "after": conditions()},
        }
    )


if __name__ == "__main__":
    main()
