"""onnxruntime alone, the ceiling of bench.gpu: the served graphs with no service around them.

    python -m bench.gpu_ceiling embed  --model-dir DIR --device cuda --sentences FILE --batches 128,512
    python -m bench.gpu_ceiling decode --model-dir DIR --device cuda --rows 1,64 --steps 128

- embed: the encoder graph, length-sorted batches padded to their longest, `session.run` with
  host arrays (the copies in and out are counted): sentences/s per batch size.
- decode: a bare greedy step loop on the GroupQueryAttention decoder. Every per-step input lives
  in an OrtValue on the device, bound once and refilled with `update_inplace`; each layer's KV
  buffer (rows, H, max_length, D) is bound as both past and present (written in place); the
  logits come back to the host for the argmax. The cache starts at `--start` filled positions
  (zeros: values do not change the time). Figures: microseconds per step and tokens/s per row
  count. No prefill, no scheduling, no detokenising: what the service could reach at best.
Imports no torch. One JSON line out (bench.common.emit); each phase bounded by `--budget-s`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from bench.common import emit
from service.manifest import load_model_dir

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


def open_session(model_dir: Path, role: str, device: str) -> tuple[ort.InferenceSession, str]:
    """The variant the service serves on the device (fp16 on CUDA, optimized on the CPU)."""
    manifest = load_model_dir(model_dir, verify_hashes=False).manifest
    variant = next(
        v
        for v in (("fp16", "optimized", "fp32") if device == "cuda" else ("optimized", "fp32"))
        if v in manifest.variants(role)
    )
    providers = [CUDA, CPU] if device == "cuda" else [CPU]
    sess = ort.InferenceSession(str(model_dir / manifest.graph(role, variant).file), providers=providers)
    if sess.get_providers()[0] != providers[0]:
        raise RuntimeError(f"asked for {providers[0]}, onnxruntime runs {sess.get_providers()}")
    return sess, variant


def embed_side(args: argparse.Namespace) -> dict:
    sess, variant = open_session(args.model_dir, "encoder", args.device)
    tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    ids = sorted((e.ids for e in tok.encode_batch(json.loads(args.sentences.read_text(encoding="utf-8")))), key=len)
    out = {}
    for batch in (int(b) for b in args.batches.split(",")):

        def one_pass(batch: int = batch) -> None:
            for start in range(0, len(ids), batch):
                rows = ids[start : start + batch]
                feed = np.zeros((len(rows), len(rows[-1])), np.int64)  # sorted: the last row is the longest
                mask = np.zeros_like(feed)
                for r, row in enumerate(rows):
                    feed[r, : len(row)], mask[r, : len(row)] = row, 1
                sess.run(None, {"input_ids": feed, "attention_mask": mask})

        seconds = _timed(one_pass, args.budget_s)
        out[str(batch)] = round(len(ids) / min(seconds), 1)
    return {"variant": variant, "sentences": len(ids), "sentences_per_s_by_batch": out}


def decode_side(args: argparse.Namespace) -> dict:
    sess, variant = open_session(args.model_dir, "decoder", args.device)
    spec = {i.name: i for i in sess.get_inputs()}
    kv_names = [n for n in spec if n.startswith("past_key_values.")]
    _, heads, _, head_dim = spec[kv_names[0]].shape
    kv_type = np.float16 if spec[kv_names[0]].type == "tensor(float16)" else np.float32
    arch = load_model_dir(args.model_dir, verify_hashes=False).manifest.architecture
    length, vocab = int(arch["max_positions"]), int(arch["vocab_size"])
    out = {}
    for rows in (int(r) for r in args.rows.split(",")):
        step, tokens = _bound_loop(sess, kv_names, (rows, heads, length, head_dim), kv_type, vocab, args)
        seconds = _timed(lambda step=step: [step(t) for t in range(args.steps)], args.budget_s)
        per_step = min(seconds) / args.steps
        out[str(rows)] = {
            "us_per_step": round(per_step * 1e6, 1),
            "tokens_per_s": round(rows / per_step, 1),
            "first_tokens_row0": tokens[:8],
        }
    return {"variant": variant, "start_length": args.start, "steps": args.steps, "by_rows": out}


def _bound_loop(sess, kv_names, shape, kv_type, vocab: int, args):
    """-> step(t) running one bound decode step, and the list the argmax tokens of row 0 go to."""
    dev, rows = args.device, shape[0]

    def value(array: np.ndarray, where: str = dev) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(array, where, 0)

    ids, pos, seqlens = (
        value(np.zeros((rows, 1), np.int64)),
        value(np.zeros((rows, 1), np.int64)),
        value(np.zeros(rows, np.int32)),
    )
    total = value(np.zeros((), np.int32), "cpu")  # a host input of GroupQueryAttention
    logits = ort.OrtValue.ortvalue_from_shape_and_type((rows, 1, vocab), kv_type, "cpu", 0)  # copied out each run
    binding = sess.io_binding()
    fixed = [("input_ids", ids), ("position_ids", pos), ("seqlens_k", seqlens), ("total_sequence_length", total)]
    if "logits_positions" in {i.name for i in sess.get_inputs()}:  # the one new token's logits
        fixed.append(("logits_positions", value(np.zeros((rows, 1), np.int64))))
    for name, v in fixed:
        binding.bind_ortvalue_input(name, v)
    for name in kv_names:
        buffer = ort.OrtValue.ortvalue_from_shape_and_type(shape, kv_type, dev, 0)
        binding.bind_ortvalue_input(name, buffer)
        binding.bind_ortvalue_output(name.replace("past_key_values", "present"), buffer)
    binding.bind_ortvalue_output("logits", logits)
    tokens: list[int] = []
    last = np.zeros((rows, 1), np.int64)

    def step(t: int) -> None:
        nonlocal last
        at = args.start + t % (shape[2] - args.start)  # wrap before the buffer's end
        ids.update_inplace(last)
        pos.update_inplace(np.full((rows, 1), at, np.int64))
        seqlens.update_inplace(np.full(rows, at, np.int32))  # tokens cached after this step, minus one
        total.update_inplace(np.asarray(at + 1, np.int32))
        sess.run_with_iobinding(binding)
        last = logits.numpy().argmax(-1).astype(np.int64)  # (rows, 1), on the host
        tokens.append(int(last[0, 0]))

    return step, tokens


def _timed(run, budget_s: float) -> list[float]:
    """Seconds of run() after one warm-up call, repeated until budget_s has passed (at least once)."""
    run()
    seconds: list[float] = []
    end = time.perf_counter() + budget_s
    while not seconds or time.perf_counter() < end:
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return seconds


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_ceiling", description=__doc__.split("\n")[0])
    p.add_argument("side", choices=["embed", "decode"])
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--budget-s", type=float, default=10.0)
    p.add_argument("--sentences", type=Path, help="embed: JSON list of sentences")
    p.add_argument("--batches", default="128,512", help="embed: batch sizes")
    p.add_argument("--rows", default="1,64", help="decode: row counts")
    p.add_argument("--steps", type=int, default=128, help="decode: steps per timed pass")
    p.add_argument("--start", type=int, default=16, help="decode: cached positions before the first step")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    emit(embed_side(args) if args.side == "embed" else decode_side(args))


if __name__ == "__main__":
    main()
