"""Decoding tokens/s at 1 and N streams: the service against CTranslate2 on the same checkpoint.

The peer a CPU user picks for a 124M-1B decoder is CTranslate2 (int8 is its fast path); this runs
it beside the service on one Hugging Face folder and its conversion, one thread a side (or
`--threads`), each side in its own process, sides alternated over `--rounds`:
- service: `python -m service --models MODELS --variant V --intra-op-threads T --compute-workers 1`,
  N concurrent gRPC GenerateStream calls of the same prompt ids, greedy, `--new-tokens` each,
  prompt-lookup speculation off (plain decoding);
- ctranslate2 (`--ct2-types`, e.g. int8,float32): the folder converted by CTranslate2's own
  converter (cached under --work), `Generator(intra_threads=T)`; one stream through
  `generate_tokens` (its first token timed), N streams as one `generate_batch` of N prompts
  (its static batch: what a CTranslate2 user runs), exactly `--new-tokens` tokens each;
- onnxruntime-genai (`--genai-python`, the interpreter of a virtual environment holding it, since it
  pins its own onnxruntime; `--genai-types`, e.g. int4): the folder converted by its own model
  builder, greedy, one stream and N streams as one batch (bench/genai_side.py).
Prompts are `--prompt-tokens` seeded random token ids, the same for every side. Reported per side
and stream count: tokens/s (generated tokens over wall time), time to first token at one stream,
CPU seconds per token (the server's process tree from /proc; the peer's own process time), and,
with the served file's weight bytes, the read bandwidth one stream implies. Random weights decode
arbitrary tokens; EOS is ignored where the side allows it, and tokens are counted as generated.

    python -m bench.decode_peers --hf FOLDER --models MODELS --model NAME --variant int8 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import ServiceProcess, conditions, emit, run_worker, summary
from bench.procstat import cpu_seconds


def prompts(vocab: int, count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(vocab // 4, vocab - 1, size=length).tolist() for _ in range(count)]


async def _stream(stub, pb, model: str, ids: list[int], new: int) -> tuple[int, float]:
    """(tokens generated, seconds to the first) of one GenerateStream."""
    request = pb.GenerateRequest(model=model, max_new_tokens=new, prompt_token_ids=ids, speculative=False)
    start, first, tokens = time.perf_counter(), None, 0
    async for chunk in stub.GenerateStream(request, timeout=600):
        if chunk.token_ids and first is None:
            first = time.perf_counter() - start
        tokens += len(chunk.token_ids)
    return tokens, first or 0.0


async def _service(address: str, pid: int, model: str, batches: list[list[list[int]]], new: int) -> dict:
    import grpc

    from service.proto import inference_pb2 as pb
    from service.proto import inference_pb2_grpc as pb_grpc

    out = {}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        await _stream(stub, pb, model, batches[0][0], 8)  # warm-up
        for rows in batches:
            start, cpu = time.perf_counter(), cpu_seconds(pid)
            done = await asyncio.gather(*(_stream(stub, pb, model, ids, new) for ids in rows))
            wall, used = time.perf_counter() - start, cpu_seconds(pid) - cpu
            tokens = sum(t for t, _ in done)
            out[str(len(rows))] = {
                "tokens_per_s": tokens / wall,
                "cpu_ms_per_token": 1000 * used / tokens,
                "ttft_ms": 1000 * min(f for _, f in done),
                "tokens": tokens,
            }
    return out


def service_side(args) -> dict:
    flags = ["--variant", args.variant, "--intra-op-threads", str(args.threads), "--compute-workers", "1"]
    flags += ["--http-port", "-1"]
    server = ServiceProcess(args.models, flags + list(args.server_flag), http=False)
    try:
        batches = [prompts(args.vocab, n, args.prompt_tokens) for n in args.streams]
        return asyncio.run(_service(server.address, server.proc.pid, args.model, batches, args.new_tokens))
    finally:
        server.stop()


def peer_dir(args, peer: str, kind: str) -> Path:
    """Where a peer's conversion of --hf is kept: per folder and type, since --work outlives a run."""
    return args.work / f"{peer}-{args.hf.resolve().name}-{kind}"


def ct2_dir(args, compute_type: str) -> Path:
    """The folder converted by CTranslate2's own converter (once per folder and type, under --work)."""
    import ctranslate2

    out = peer_dir(args, "ct2", compute_type)
    if not (out / "model.bin").is_file():
        started = time.perf_counter()
        ctranslate2.converters.TransformersConverter(str(args.hf)).convert(
            str(out), quantization=compute_type, force=True
        )
        print(f"ct2 {compute_type}: converted in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return out


def ct2_side(args, compute_type: str) -> dict:
    import ctranslate2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.hf))
    generator = ctranslate2.Generator(
        str(ct2_dir(args, compute_type)), device="cpu", compute_type=compute_type, intra_threads=args.threads
    )
    new = args.new_tokens
    options = {"max_length": new, "min_length": new, "sampling_topk": 1, "include_prompt_in_result": False}
    out = {}
    warm = [tokenizer.convert_ids_to_tokens(prompts(args.vocab, 1, args.prompt_tokens)[0])]
    generator.generate_batch(warm, **{**options, "max_length": 8, "min_length": 8})
    for n in args.streams:
        rows = [tokenizer.convert_ids_to_tokens(ids) for ids in prompts(args.vocab, n, args.prompt_tokens)]
        start, cpu = time.perf_counter(), time.process_time()
        if n == 1:
            first, steps = None, generator.generate_tokens(rows[0], max_length=new, sampling_topk=1)
            for _ in steps:  # the first step timed, the rest counted
                first = time.perf_counter() - start
                break
            tokens = 1 + sum(1 for _ in steps)
        else:
            results = generator.generate_batch(rows, **options)
            tokens, first = sum(len(r.sequences_ids[0]) for r in results), None
        wall, used = time.perf_counter() - start, time.process_time() - cpu
        out[str(n)] = {
            "tokens_per_s": tokens / wall,
            "cpu_ms_per_token": 1000 * used / tokens,
            "ttft_ms": 1000 * first if first is not None else None,
            "tokens": tokens,
        }
    return out


def genai_dir(args, precision: str) -> Path:
    """The folder converted by onnxruntime-genai's builder (once per folder and precision, under --work); its
    genai_config.json set to --threads intra-op threads."""
    out = peer_dir(args, "genai", precision)
    flags = ["--hf", str(args.hf), "--out", str(out), "--precision", precision, "--threads", str(args.threads)]
    built = run_worker("bench.genai_side", "build", *flags, python=args.genai_python)["built_s"]
    if built:
        print(f"genai {precision}: converted in {built:.1f}s", file=sys.stderr)
    return out


def genai_side(args, precision: str) -> dict:
    """One onnxruntime-genai round, in the genai interpreter, on the same prompt ids as the others."""
    work = args.work / "prompts.json"
    work.write_text(json.dumps(prompts(args.vocab, max(args.streams), args.prompt_tokens)))
    flags = ["--model", str(peer_dir(args, "genai", precision)), "--prompts", str(work)]
    flags += ["--streams", ",".join(map(str, args.streams)), "--new-tokens", str(args.new_tokens)]
    return run_worker("bench.genai_side", "run", *flags, timeout=1800, python=args.genai_python)


def weight_bytes(args) -> int:
    """Bytes a decode step reads from the served file: every initializer but the Gather tables'
    (a token reads one row of those)."""
    import onnx

    from service.manifest import load_model_dir

    model_dir = load_model_dir(args.models / args.model)
    path = model_dir.file(model_dir.manifest.graph("decoder", args.variant).file)
    graph = onnx.load(str(path)).graph
    gathered = {n.input[i] for n in graph.node if n.op_type.startswith("Gather") for i in (0, 2, 3) if i < len(n.input)}
    four_bit = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)

    def size(t: onnx.TensorProto) -> int:  # 4-bit tensors: half a byte a value
        return int(np.prod(t.dims)) // 2 if t.data_type in four_bit else onnx.numpy_helper.to_array(t).nbytes

    return sum(size(t) for t in graph.initializer if t.name not in gathered)


def read_bandwidth_gb_s() -> float:
    """One thread summing a 1 GiB float32 array (best of 5)."""
    a = np.ones(2**28, np.float32)
    a.sum()
    best = min(_timed(a.sum) for _ in range(5))
    return a.nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--side", help=argparse.SUPPRESS)  # service | ct2:TYPE (one side, in its own process)
    p.add_argument("--hf", type=Path, required=True, help="the Hugging Face folder (CTranslate2 converts it)")
    p.add_argument("--models", type=Path, required=True, help="the served models folder (its conversion)")
    p.add_argument("--model", required=True)
    p.add_argument("--variant", default="int8")
    p.add_argument("--ct2-types", default="int8,float32")
    p.add_argument("--genai-python", help="an interpreter with onnxruntime-genai (its own venv): adds its sides")
    p.add_argument("--genai-types", default="int4")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench-decode-peers"))
    p.add_argument("--server-flag", action="append", default=[], help="extra `python -m service` flag")
    args = p.parse_args(argv)
    args.streams = [int(s) for s in str(args.streams).split(",")]
    args.vocab = json.loads((args.hf / "config.json").read_text())["vocab_size"]
    if args.side:
        emit(service_side(args) if args.side == "service" else ct2_side(args, args.side.split(":", 1)[1]))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    sides = ["service", *(f"ct2:{t}" for t in args.ct2_types.split(",") if t)]
    if args.genai_python:
        sides += [f"genai:{t}" for t in args.genai_types.split(",") if t]
    for side in sides[1:]:  # converted before any timing
        kind, kind_type = side.split(":", 1)
        (ct2_dir if kind == "ct2" else genai_dir)(args, kind_type)
    passed = list(argv if argv is not None else sys.argv[1:])
    before = conditions()
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            if side.startswith("genai:"):
                runs[side].append(genai_side(args, side.split(":", 1)[1]))
            else:
                runs[side].append(run_worker("bench.decode_peers", *passed, "--side", side, timeout=1800))
            print(f"round {r + 1} {side}: {json.dumps(runs[side][-1])}", file=sys.stderr)
    result: dict = {"variant": args.variant, "threads": args.threads, "new_tokens": args.new_tokens, "sides": {}}
    for side, rounds in runs.items():
        result["sides"][side] = {
            n: {
                "tokens_per_s": summary([x[n]["tokens_per_s"] for x in rounds], 1),
                "cpu_ms_per_token": summary([x[n]["cpu_ms_per_token"] for x in rounds], 3),
                "ttft_ms": summary([x[n]["ttft_ms"] for x in rounds if x[n]["ttft_ms"] is not None] or [0], 1),
            }
            for n in map(str, args.streams)
        }
    service = result["sides"]["service"]
    for side in sides[1:]:
        result[f"service_over_{side}"] = {
            n: round(service[n]["tokens_per_s"]["median"] / result["sides"][side][n]["tokens_per_s"]["median"], 3)
            for n in map(str, args.streams)
        }
    bytes_per_token, bandwidth = weight_bytes(args), read_bandwidth_gb_s()
    one = service[str(args.streams[0])]["tokens_per_s"]["median"]
    result["roofline"] = {
        "weight_mb_per_token": round(bytes_per_token / 1e6, 1),
        "read_gb_s_one_thread": round(bandwidth, 1),
        "service_one_stream_gb_s": round(one * bytes_per_token / 1e9, 2),
        "service_one_stream_fraction": round(one * bytes_per_token / 1e9 / bandwidth, 3),
    }
    emit({**result, "conditions": {"before": before, "after": conditions()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
