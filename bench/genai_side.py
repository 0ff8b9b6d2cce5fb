"""onnxruntime-genai as a side of bench/decode_peers.py, run by its own interpreter.

onnxruntime-genai pins its own onnxruntime, so it lives in a virtual environment of its own
(`--genai-python`; `pip install onnxruntime-genai onnx onnx-ir transformers torch==2.13.0` there:
its builder imports onnx_ir) and this module imports nothing of the project's: only numpy and
onnxruntime_genai, plus its model builder.

    python -m bench.genai_side build --hf FOLDER --out DIR --precision int4 --threads 1
    python -m bench.genai_side run --model DIR --prompts FILE.json --streams 1,8 --new-tokens 128

`build` converts the Hugging Face folder with onnxruntime-genai's own builder (`-e cpu`,
`int4_accuracy_level=4`: int8 compute in `MatMulNBits`, as the project's int4) and sets the
session's intra-op threads in its genai_config.json. `run` decodes greedily, one stream through
`generate_next_token` (its first token timed) and N streams as one batch of N prompts, exactly
`--new-tokens` tokens each (`min_length` = `max_length`), and prints one JSON line like the
CTranslate2 side's: tokens/s, CPU ms per token (this process's), first-token ms at one stream.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def build(hf: Path, out: Path, precision: str, threads: int) -> float:
    """Converts with onnxruntime-genai's builder; -> seconds it took (0 when already built)."""
    config = out / "genai_config.json"
    took = 0.0
    if not config.is_file():
        started = time.perf_counter()
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
        cmd += ["-p", precision, "-e", "cpu", "-c", str(out.parent / "genai-cache")]
        cmd += ["--extra_options", "int4_accuracy_level=4"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        took = time.perf_counter() - started
    settings = json.loads(config.read_text())
    options = settings["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    options["inter_op_num_threads"] = 1
    config.write_text(json.dumps(settings, indent=2))
    return took


def run(model_dir: Path, prompts: list[list[int]], streams: list[int], new: int) -> dict:
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))

    def generator(rows: list[list[int]], tokens: int):
        params = og.GeneratorParams(model)
        length = len(rows[0]) + tokens
        params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=len(rows))
        g = og.Generator(model, params)
        g.append_tokens(np.asarray(rows, np.int32))
        return g

    warm = generator(prompts[:1], 8)
    while not warm.is_done():
        warm.generate_next_token()
    out = {}
    for n in streams:
        rows = [prompts[i % len(prompts)] for i in range(n)]
        start, cpu = time.perf_counter(), time.process_time()
        g = generator(rows, new)  # the prompt is prefilled by append_tokens
        first = None
        while not g.is_done():
            g.generate_next_token()
            if first is None:
                first = time.perf_counter() - start
        wall, used = time.perf_counter() - start, time.process_time() - cpu
        tokens = sum(len(g.get_sequence(i)) - len(rows[i]) for i in range(n))
        out[str(n)] = {
            "tokens_per_s": tokens / wall,
            "cpu_ms_per_token": 1000 * used / tokens,
            "ttft_ms": 1000 * first if n == 1 and first is not None else None,
            "tokens": tokens,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("action", choices=["build", "run"])
    p.add_argument("--hf", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--precision", default="int4")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", type=Path)
    p.add_argument("--prompts", type=Path)
    p.add_argument("--streams", default="1,8")
    p.add_argument("--new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    if args.action == "build":
        result: dict = {"built_s": round(build(args.hf, args.out, args.precision, args.threads), 1)}
    else:
        streams = [int(s) for s in args.streams.split(",")]
        result = run(args.model, json.loads(args.prompts.read_text()), streams, args.new_tokens)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
