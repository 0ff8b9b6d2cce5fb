"""The sides of bench.converted, each run in its own process (see bench/common.py); one JSON line out.

    python -m bench.converted_workers folder      --folder F --name gpt2|llama|bert
    python -m bench.converted_workers convert     --folder F --models DIR --name N [--variants ...]
    python -m bench.converted_workers hf-generate --folder F --new-tokens N --threads T --repeats R
    python -m bench.converted_workers gen-client  --address A --server-pid P --new-tokens N --repeats R
    python -m bench.converted_workers st-embed | ort-embed | embed-client ... --vectors OUT.npy

folder builds the Hugging Face folder; convert runs `python -m export convert` (wall time, peak
memory); hf-generate is transformers' greedy `generate` (time to first token, one stream, a
left-padded batch); gen-client makes GenerateStream calls and reads the server's CPU per token;
the embedding sides are sentence-transformers, the service's own engine without the server
(`load_engine`), and Embed calls from concurrent clients. Only folder, convert, hf-generate and
st-embed import torch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import emit
from bench.converted_folders import prompts
from bench.procstat import cpu_seconds


def folder_side(args: argparse.Namespace) -> dict:
    from bench.converted_folders import BUILDERS

    args.folder.mkdir(parents=True)
    return BUILDERS[args.name](args.folder)


def convert_side(args: argparse.Namespace) -> dict:
    from export.convert.cli import main as convert_main

    argv = [
        "convert",
        str(args.folder),
        "--out",
        str(args.models),
        "--name",
        args.name,
        "--variants",
        args.variants,
        "--device",
        "cpu",
    ]
    if args.context:
        argv += [
            "--max-input-tokens",
            str(args.context // 2),
            "--max-output-tokens",
            str(args.context - args.context // 2),
        ]
    started = time.perf_counter()
    rc = convert_main(argv)
    return {
        "rc": rc,
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def _new_tokens(row: list[int], eos: int | None) -> list[int]:
    """Generated ids up to and including the first EOS (what a stream would have returned)."""
    return row[: row.index(eos) + 1] if eos is not None and eos in row else row


def hf_generate_side(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    tok = AutoTokenizer.from_pretrained(args.folder)
    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    tok.pad_token, tok.padding_side = tok.eos_token, "left"
    texts = prompts(args.batch)

    @torch.no_grad()
    def run(batch: list[str], new: int) -> tuple[float, float, list[list[int]]]:
        enc = tok(batch, return_tensors="pt", padding=True)
        wall, cpu = time.perf_counter(), time.process_time()
        out = model.generate(**enc, max_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=tok.pad_token_id)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall, cpu, [_new_tokens(row.tolist(), eos) for row in out[:, enc["input_ids"].shape[1] :]]

    run(texts[:1], 4)  # warm-up
    ttft = [run(texts[:1], 1)[0] for _ in range(args.repeats)]
    one = [run(texts[:1], args.new_tokens) for _ in range(args.repeats)]
    many = run(texts, args.new_tokens) if args.batch > 1 else None
    out = {
        "ttft_ms": [round(t * 1e3, 1) for t in ttft],
        "one_tokens_per_s": [round(len(r[2][0]) / r[0], 2) for r in one],
        "one_cpu_ms_per_token": [round(r[1] / len(r[2][0]) * 1e3, 2) for r in one],
        "tokens": one[-1][2][0],
        "prompt_tokens": len(tok(texts[0])["input_ids"]),
        "threads": torch.get_num_threads(),
    }
    if many:
        count = sum(len(r) for r in many[2])
        out.update(
            batch=args.batch,
            batch_tokens_per_s=round(count / many[0], 2),
            batch_cpu_ms_per_token=round(many[1] / count * 1e3, 2),
        )
    return out


async def _stream(client, prompt: str, new_tokens: int) -> tuple[float, float, list[int]]:
    """One GenerateStream call -> (seconds to the first token, seconds to the last, token ids)."""
    start, first, tokens = time.perf_counter(), None, []
    async for chunk in client.generate_stream(prompt, max_new_tokens=new_tokens):
        if chunk.token_ids and first is None:
            first = time.perf_counter() - start
        tokens += chunk.token_ids
    return first or 0.0, time.perf_counter() - start, tokens


async def _streams(client, pid: int, texts: list[str], new_tokens: int) -> dict:
    cpu = cpu_seconds(pid)
    start = time.perf_counter()
    runs = await asyncio.gather(*(_stream(client, t, new_tokens) for t in texts))
    wall, cpu = time.perf_counter() - start, cpu_seconds(pid) - cpu
    count = sum(len(r[2]) for r in runs)
    return {
        "tokens_per_s": count / wall,
        "ttft_ms": statistics.median(r[0] for r in runs) * 1e3,
        "cpu_ms_per_token": cpu / count * 1e3,
        "tokens": runs[0][2],
    }


def _pick(runs: list[dict], key: str, digits: int = 2) -> list[float]:
    return [round(r[key], digits) for r in runs]


async def gen_client_side(args: argparse.Namespace) -> dict:
    from client import AsyncClient

    texts = prompts(args.streams)
    async with AsyncClient(args.address, timeout=900) as client:
        await _streams(client, args.server_pid, texts, 4)  # warm-up: connections, code paths, every row
        one = [await _streams(client, args.server_pid, texts[:1], args.new_tokens) for _ in range(args.repeats)]
        many = [await _streams(client, args.server_pid, texts, args.new_tokens) for _ in range(args.repeats)]
    return {
        "one_tokens_per_s": _pick(one, "tokens_per_s"),
        "ttft_ms": _pick(one, "ttft_ms", 1),
        "one_cpu_ms_per_token": _pick(one, "cpu_ms_per_token"),
        "tokens": one[-1]["tokens"],
        "streams": args.streams,
        "many_tokens_per_s": _pick(many, "tokens_per_s"),
        "many_ttft_ms": _pick(many, "ttft_ms", 1),
        "many_cpu_ms_per_token": _pick(many, "cpu_ms_per_token"),
    }


def _sentences(path: Path) -> list[str]:
    return json.loads(path.read_text(encoding="utf-8"))


def st_embed_side(args: argparse.Namespace) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    texts = _sentences(args.sentences)
    model = SentenceTransformer(str(args.folder), device="cpu")
    model.encode(texts[:32], batch_size=args.batch, show_progress_bar=False)  # warm-up
    wall, cpu = time.perf_counter(), time.process_time()
    vectors = model.encode(
        texts, batch_size=args.batch, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    np.save(args.vectors, vectors.astype(np.float32))
    return {
        "sentences_per_s": round(len(texts) / wall, 2),
        "cpu_ms_per_sentence": round(cpu / len(texts) * 1e3, 2),
        "batch": args.batch,
        "max_seq_length": model.max_seq_length,
        "threads": torch.get_num_threads(),
    }


def ort_embed_side(args: argparse.Namespace) -> dict:
    from tokenizers import Tokenizer

    from service.embedding.engine import postprocess
    from service.embedding.model import load_engine
    from service.engine.tokenization import Encoded
    from service.manifest import load_model_dir
    from service.runtime import Runtime
    from service.settings import Settings

    model_dir = load_model_dir(args.model_dir)
    settings = Settings.from_env(
        env={},
        models=str(args.model_dir.parent),
        port=0,
        metrics_port=-1,
        intra_op_threads=args.threads,
        variant=args.variant,
    )
    runtime = Runtime(settings)
    variant, engine = load_engine(model_dir, settings, runtime)  # the graph and engine the service runs
    tokenizer = Tokenizer.from_file(str(model_dir.file("tokenizer.json")))  # truncates at max_input_tokens
    texts = _sentences(args.sentences)
    dim = model_dir.manifest.embedding_dim
    if dim is None:
        raise ValueError(f"{args.model_dir} is not an embedding model (no embedding_dim)")

    def embed() -> np.ndarray:
        encoded = [Encoded(e.ids, e.type_ids) for e in tokenizer.encode_batch(texts)]
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        out = np.zeros((len(texts), dim), dtype=np.float32)
        for start in range(0, len(order), args.batch):
            rows = order[start : start + args.batch]
            out[rows] = engine.forward([encoded[i] for i in rows])
        return postprocess(out, True, 0)

    embed()  # warm-up
    wall, cpu = time.perf_counter(), time.process_time()
    vectors = embed()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    runtime.close()
    np.save(args.vectors, vectors)
    return {
        "sentences_per_s": round(len(texts) / wall, 2),
        "cpu_ms_per_sentence": round(cpu / len(texts) * 1e3, 2),
        "batch": args.batch,
        "variant": variant,
        "packed": bool(getattr(engine, "packed", False)),
    }


async def _embed_calls(stub, name: str, texts: list[str], clients: int) -> np.ndarray:
    """Every text in its own Embed call, `clients` calls in flight at once -> the vectors, normalised."""
    from client import embed_request

    out: dict[int, np.ndarray] = {}
    todo = list(enumerate(texts))[::-1]

    async def client() -> None:
        while todo:
            i, text = todo.pop()
            response = await stub.Embed(embed_request([text], model=name, normalize=True, truncate=True), timeout=120)
            out[i] = np.asarray(response.embeddings[0].values, dtype=np.float32)

    await asyncio.gather(*(client() for _ in range(clients)))
    return np.stack([out[i] for i in range(len(texts))])


async def embed_client_side(args: argparse.Namespace) -> dict:
    import grpc

    from bench.embed_throughput import resolve_model
    from service.proto import inference_pb2_grpc as pb_grpc

    texts = _sentences(args.sentences)
    name = await resolve_model(args.address, "")
    async with grpc.aio.insecure_channel(args.address) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        await _embed_calls(stub, name, texts[: 4 * args.clients], args.clients)  # warm-up
        wall, cpu = time.perf_counter(), cpu_seconds(args.server_pid)
        vectors = await _embed_calls(stub, name, texts, args.clients)
        wall, cpu = time.perf_counter() - wall, cpu_seconds(args.server_pid) - cpu
    np.save(args.vectors, vectors)
    return {
        "sentences_per_s": round(len(texts) / wall, 2),
        "clients": args.clients,
        "server_cpu_ms_per_sentence": round(cpu / len(texts) * 1e3, 2),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.converted_workers", description=__doc__.split("\n")[0])
    p.add_argument(
        "side", choices=["folder", "convert", "hf-generate", "gen-client", "st-embed", "ort-embed", "embed-client"]
    )
    p.add_argument("--folder", type=Path)
    p.add_argument("--models", type=Path)
    p.add_argument("--name", default="")
    p.add_argument("--variants", default="optimized,int8")
    p.add_argument("--context", type=int, default=0, help="convert: served context (0: the converter's default)")
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--variant", default="optimized")
    p.add_argument("--address", default="")
    p.add_argument("--server-pid", type=int, default=0)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sentences", type=Path)
    p.add_argument("--vectors", type=Path)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    sides = {
        "folder": folder_side,
        "convert": convert_side,
        "hf-generate": hf_generate_side,
        "st-embed": st_embed_side,
        "ort-embed": ort_embed_side,
    }
    if args.side in sides:
        emit(sides[args.side](args))
    else:
        emit(asyncio.run(gen_client_side(args) if args.side == "gen-client" else embed_client_side(args)))


if __name__ == "__main__":
    main()
