"""Prefix caching's time to first token and prompt-lookup speculation's tokens/s, side by side.

Starts two `python -m service` over `--models` (bench.common.ServiceProcess), alike but for the
feature under test, and alternates calls between them (gRPC, one stream, token-id prompts):

- `ttft`: per round a fresh shared prompt (a held-out story's first `--shared` tokens) is sent once
  with one question to both servers, then with another `--question`-token question: that second
  call's time to its first token (client wall, one new token; and the server's own
  time_to_first_token_ms) on the server with the prefix cache (`cached`) and without (`uncached`).
- `speculate`: `--new-tokens` greedy tokens at one stream on a server with `--gen-speculate` and one
  without, for a prompt that quotes its context (a story, then its first sentence again) and for
  free generation ("Once upon a time"); tokens/s by client wall and by server CPU (/proc, over
  `--calls` calls a reading), and the share of drafted tokens kept (the speculative server's
  `ts_speculative_tokens_total`).
- `engine`: the same two prefills in this process by CPU time (`time.process_time`, one
  onnxruntime thread: a loaded machine slows the wall clock, not this): the whole prompt
  (`SlotCache.prefill`) against the shared prompt's row copied and the question continued
  (`fork` + `extend`), alternated, with the largest logit difference between the two.
- `build`: a model directory for prompts past tinystories-gpt's 128 tokens: tinystories-gpt's shape
  and tokenizer (4 layers, 256 wide, 4,096 tokens) with random weights and `--context` positions,
  exported (fp32 and optimized, through the parity gate) to `--out`/long-gpt; `ttft` and `engine`
  then take `--model long-gpt --shared 1000` (the shared prompt is the story's tokens repeated).
- `quoter`: a model that quotes its context, as an assistant editing or summarising a given text
  does: tinystories-gpt's trained checkpoint (`--checkpoint`) fine-tuned for `--steps` steps on
  training stories each followed by `QUOTE_MARKER` and the story again (next-token loss on the
  quoted half only: the story itself it already models), 12 such rows and 4 plain stories a step
  (so that it still tells a story when not quoting), exported (fp32 and optimized, through
  the gate) to `--out`/quote-gpt; `speculate` then takes `--models OUT --model quote-gpt`.
  tinystories-gpt itself tells a new story instead.
The `speculate` quoting prompt is a story's first 100 tokens, `QUOTE_MARKER`, then the story's
first 12 tokens again.
Both check that the two servers return the same tokens. Prints JSON with the CPU and load.

    python -m bench.prefix_speculation --models models --model tinystories-gpt --variant optimized ttft
    python -m bench.prefix_speculation --models models --model tinystories-gpt --variant optimized speculate
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from bench.common import ServiceProcess, conditions, emit
from bench.generate_stream_cpu import _cpu
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she "
    "saw a big tree with a swing. She ran to the swing and sat on it. Her mom pushed her high into the sky. "
    "Lily laughed and laughed. Then a small bird came and sat on the tree. The bird sang a happy song. Lily "
    'listened to the bird and smiled. She said, "Thank you, bird, for the song!" The bird flew away and Lily '
    "went home with her mom. They ate dinner and Lily went to bed. She dreamed of the bird and the swing. "
    "The next day, Tom came to play with Lily. They built a tower of blocks and a boat of paper."
)


async def _call(stub, ids: list[int], model: str, new_tokens: int, **fields) -> tuple[float, pb.GenerateResponse]:
    request = pb.GenerateRequest(prompt_token_ids=ids, model=model, max_new_tokens=new_tokens, **fields)
    start = time.perf_counter()
    reply = await stub.Generate(request)
    return time.perf_counter() - start, reply


async def ttft(stubs: dict, ids: list[int], args) -> dict:
    """Rounds of (warm call, measured call) on both servers, alternated; medians in ms."""
    wall: dict[str, list[float]] = {k: [] for k in stubs}
    server: dict[str, list[float]] = {k: [] for k in stubs}
    same = True
    for r in range(args.rounds):
        shared = ids[r : r + args.shared]  # a fresh shared prompt each round
        first, second = ids[-args.question - r - 1 :][: args.question], ids[r + args.shared :][: args.question]
        order = list(stubs) if r % 2 == 0 else list(reversed(stubs))
        tokens = {}
        for name in order:
            await _call(stubs[name], shared + first, args.model, 8)
        for name in order:
            elapsed, reply = await _call(stubs[name], shared + second, args.model, 1)
            wall[name].append(elapsed * 1e3)
            server[name].append(reply.timings.time_to_first_token_ms)
            tokens[name] = list(reply.token_ids)
            if name == "cached" and reply.usage.cached_tokens < args.shared - 1:
                raise RuntimeError(f"round {r}: only {reply.usage.cached_tokens} tokens were cached")
        same = same and len({tuple(t) for t in tokens.values()}) == 1
    out: dict[str, Any] = {
        k: {"client_ms": round(statistics.median(wall[k]), 2), "server_ttft_ms": round(statistics.median(server[k]), 2)}
        for k in stubs
    }
    out["ratio_client"] = round(out["cached"]["client_ms"] / out["uncached"]["client_ms"], 3)
    out["ratio_server"] = round(out["cached"]["server_ttft_ms"] / out["uncached"]["server_ttft_ms"], 3)
    return {**out, "same_tokens": same}


QUOTE_MARKER = " Here is the same story again:"


def quoter(args) -> None:
    """The quoting model of `quoter` (module doc); imports torch, so only here."""
    import random

    import torch
    import torch.nn.functional as F

    from export.build import build_model_dir
    from export.models.decoder import GPTDecoder
    from export.train import data
    from export.train.checkpoint import load_checkpoint

    torch.manual_seed(0)
    model, meta = load_checkpoint(args.checkpoint)
    if not isinstance(model, GPTDecoder):
        raise SystemExit(f"{args.checkpoint}: a {meta['architecture']} checkpoint, not a generator")
    tokenizer = Tokenizer.from_file(str(Path(args.checkpoint) / "tokenizer.json"))
    stories, _ = data.split_stories(data.load_stories(data.DEFAULT_DATA["generator"]))  # not the held-out ones
    marker = tokenizer.encode(QUOTE_MARKER, add_special_tokens=False).ids
    separator = model.config.eos_token_id
    encoded = [e.ids for e in tokenizer.encode_batch(stories[:4000], add_special_tokens=False)]
    # A quoting row is [separator, story, marker, story, separator]: the loss is on the quoted half
    # (from the marker's last token on). A plain row, a story alone with its whole loss, keeps the
    # model telling stories (without them, free generation after 800 steps repeated one word).
    rows = [[separator, *ids[:100], *marker, *ids[:100], separator] for ids in encoded if len(ids) >= 24]
    plain = [[separator, *ids[: 201 + len(marker)]] for ids in encoded if len(ids) >= 24]  # as long as a quoting row
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sample = random.Random(0).sample
    model.train()
    for step in range(args.steps):
        batch = [(row, True) for row in sample(rows, 12)] + [(row, False) for row in sample(plain, 4)]
        ids = torch.zeros(len(batch), max(len(row) for row, _ in batch), dtype=torch.long)  # right-padded: causal
        targets = torch.full_like(ids, -100)
        for i, (row, quoting) in enumerate(batch):
            ids[i, : len(row)] = torch.tensor(row)
            first = (len(row) - 2 - len(marker)) // 2 + len(marker) if quoting else 0
            targets[i, first : len(row) - 1] = torch.tensor(row[first + 1 :])
        logits, _ = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"quoter step {step}: loss {loss.item():.3f}", flush=True)
    build_model_dir(
        "generation",
        model.eval(),
        tokenizer,
        Path(args.out) / "quote-gpt",
        name="quote-gpt",
        special_tokens={"bos": separator, "eos": separator, "pad": separator},
        max_input_tokens=128,
        max_output_tokens=128,
        variants=("optimized",),
    )


def build(args) -> None:
    """The long-context random-weight decoder of `build` (module doc); imports torch, so only here."""
    import torch

    from export.build import build_model_dir
    from export.models.decoder import DecoderConfig, GPTDecoder

    torch.manual_seed(0)
    tokenizer = Tokenizer.from_file(str(Path(args.models) / args.model / "tokenizer.json"))
    config = DecoderConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, d_ff=1024, max_positions=args.context)
    build_model_dir(
        "generation",
        GPTDecoder(config).eval(),
        tokenizer,
        Path(args.out) / "long-gpt",
        name="long-gpt",
        special_tokens={"bos": 0, "eos": 0, "pad": 0},
        max_input_tokens=args.context - 64,
        max_output_tokens=64,
        variants=("optimized",),
    )


def engine(ids: list[int], args) -> dict:
    """CPU ms of a whole prefill vs a cached prefix's row copy + the question's pass, alternated."""
    import numpy as np
    import onnxruntime as ort

    from service.engine.graphio import GraphIO
    from service.generation.cache import SlotCache
    from service.manifest import load_model_dir

    model_dir = load_model_dir(Path(args.models) / args.model, verify_hashes=False)
    m = model_dir.manifest
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model_dir.file(m.graph("decoder", args.variant).file)), options)
    cache = SlotCache(session, GraphIO.inspect(session, m.architecture), 3, int(m.architecture["max_positions"]))
    shared, question = ids[: args.shared], ids[args.shared : args.shared + args.question]
    times: dict[str, list[float]] = {"uncached": [], "cached": []}
    drift = 0.0
    for _ in range(args.rounds * 5):
        cache.reset()
        cache.prefill([shared])  # row 0: the shared prompt, as a kept row holds it
        start = time.process_time()
        whole = cache.prefill([shared + question])[0]  # row 1
        times["uncached"].append(time.process_time() - start)
        start = time.process_time()
        row = cache.fork(0, len(shared))  # row 2
        cached = cache.extend(row, question)[-1]
        times["cached"].append(time.process_time() - start)
        drift = max(drift, float(np.abs(whole - cached).max()))
    out = {k: {"cpu_ms": round(statistics.median(v) * 1e3, 3)} for k, v in times.items()}
    return {**out, "ratio": round(out["cached"]["cpu_ms"] / out["uncached"]["cpu_ms"], 3), "max_logit_diff": drift}


def _drafts(url: str) -> dict[str, float]:
    """The speculative server's `ts_speculative_tokens_total` by outcome (accepted, rejected)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "ts_speculative_tokens":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["outcome"]] = out.get(sample.labels["outcome"], 0.0) + sample.value
    return out


async def speculate(stubs: dict, pids: dict, prompts: dict, args, metrics_url: str) -> dict:
    """Per workload, tokens/s by wall and by server CPU on both servers, alternated; medians; and the
    share of drafted tokens the speculative server kept."""
    out: dict[str, dict[str, Any]] = {}
    for workload, ids in prompts.items():
        drafted = _drafts(metrics_url)
        rate: dict[str, list[float]] = {k: [] for k in stubs}
        cpu_rate: dict[str, list[float]] = {k: [] for k in stubs}
        tokens = {}
        for r in range(args.rounds):
            for name in list(stubs) if r % 2 == 0 else list(reversed(stubs)):
                before, elapsed, n = _cpu(pids[name])[0], 0.0, 0
                for _ in range(args.calls):  # CPU ticks are 10 ms: several calls per reading
                    took, reply = await _call(stubs[name], ids, args.model, args.new_tokens)
                    elapsed, n = elapsed + took, n + len(reply.token_ids)
                spent = _cpu(pids[name])[0] - before
                rate[name].append(n / elapsed)
                cpu_rate[name].append(n / spent if spent > 0 else float("nan"))
                tokens[name] = list(reply.token_ids)
        out[workload] = {
            k: {
                "tokens": len(tokens[k]),
                "tok_s": round(statistics.median(rate[k]), 1),
                "tok_per_cpu_s": round(statistics.median(cpu_rate[k]), 1),
            }
            for k in stubs
        }
        out[workload]["speedup"] = round(out[workload]["speculative"]["tok_s"] / out[workload]["plain"]["tok_s"], 2)
        out[workload]["same_tokens"] = tokens["speculative"] == tokens["plain"]
        after = _drafts(metrics_url)
        kept, dropped = (after.get(k, 0.0) - drafted.get(k, 0.0) for k in ("accepted", "rejected"))
        out[workload]["drafts"] = {
            "accepted": int(kept),
            "rejected": int(dropped),
            "accepted_share": round(kept / (kept + dropped), 3) if kept + dropped else None,
        }
    return out


async def main(args) -> None:
    tokenizer = Tokenizer.from_file(str(Path(args.models) / args.model / "tokenizer.json"))
    if args.what == "build":  # tinystories-gpt's tokenizer (--model), a new model in --out
        build(args)
        return
    if args.what == "quoter":
        quoter(args)
        return
    ids = tokenizer.encode(STORY).ids
    ids = ids * (1 + (args.shared + args.question + args.rounds) // len(ids))  # long shared prompts: repeated
    if args.what == "engine":
        emit(
            {
                "what": "engine",
                "model": args.model,
                "variant": args.variant,
                "shared_tokens": args.shared,
                "question_tokens": args.question,
                "result": engine(ids, args),
                "conditions": conditions(),
            }
        )
        return
    base = ["--variant", args.variant, "--intra-op-threads", "1"]
    root = Path(tempfile.mkdtemp(prefix="prefix-bench-"))  # the one model, not every model of --models
    (root / args.model).symlink_to((Path(args.models) / args.model).resolve(), target_is_directory=True)
    if args.what == "ttft":
        flags = {"cached": ["--gen-prefix-cache"], "uncached": ["--no-gen-prefix-cache"]}
    else:
        flags = {"speculative": ["--gen-speculate", "--no-gen-prefix-cache"], "plain": ["--no-gen-prefix-cache"]}
    servers = {k: ServiceProcess(root, base + f, metrics=k == "speculative") for k, f in flags.items()}
    try:
        channels = {k: grpc.aio.insecure_channel(s.address) for k, s in servers.items()}
        stubs = {k: pb_grpc.GenerationServiceStub(c) for k, c in channels.items()}
        for stub in stubs.values():
            await _call(stub, ids[:16], args.model, 8)
        if args.what == "ttft":
            result = await ttft(stubs, ids, args)
        else:
            marker = tokenizer.encode(QUOTE_MARKER, add_special_tokens=False).ids
            quote = ids[:100] + marker + ids[:12]  # a story, then its start again: the continuation quotes it
            free = tokenizer.encode("Once upon a time").ids
            result = await speculate(
                stubs,
                {k: s.proc.pid for k, s in servers.items()},
                {"quote": quote, "free": free},
                args,
                servers["speculative"].metrics_url,
            )
        for c in channels.values():
            await c.close()
    finally:
        for s in servers.values():
            s.stop()
    emit(
        {
            "what": args.what,
            "model": args.model,
            "variant": args.variant,
            "shared_tokens": args.shared,
            "question_tokens": args.question,
            "new_tokens": args.new_tokens,
            "rounds": args.rounds,
            "result": result,
            "conditions": conditions(),
        }
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("ttft", "engine", "speculate", "build", "quoter"))
    parser.add_argument("--checkpoint", default="checkpoints/tinystories-gpt", help="quoter: the model fine-tuned")
    parser.add_argument("--steps", type=int, default=600, help="quoter: fine-tuning steps (16 rows each)")
    parser.add_argument("--lr", type=float, default=5e-4, help="quoter: AdamW's learning rate")
    parser.add_argument("--context", type=int, default=1280, help="positions of the built model (build)")
    parser.add_argument(
        "--out", default=str(Path(tempfile.gettempdir()) / "prefix-bench"), help="build, quoter: where the model goes"
    )
    parser.add_argument("--models", default="models")
    parser.add_argument("--model", default="tinystories-gpt")
    parser.add_argument("--variant", default="optimized")
    parser.add_argument("--shared", type=int, default=100, help="shared prompt tokens (ttft)")
    parser.add_argument("--question", type=int, default=20, help="question tokens after it (ttft)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per call (speculate)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=4, help="calls per reading (speculate)")
    asyncio.run(main(parser.parse_args()))
