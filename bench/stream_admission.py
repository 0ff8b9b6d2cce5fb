"""Time to first token and tokens/s under concurrent streams over the OpenAI door, per server setup.

For each setup (`--setup NAME=FLAGS`, e.g. `cap16="--gen-max-batch 16"`), in alternating rounds,
starts `python -m service` over `--models` and, after a warm-up, sends `--streams` concurrent
streamed completions (the openai SDK, an `AsyncOpenAI` client per stream; `--client http`: a bare
HTTP client reading the events as JSON lines, to tell the SDK's own cost apart) of
`--new-tokens` tokens at temperature 0.8 (seeded per stream, so every setup decodes the same
tokens), then 8 streams and 1 stream. Per burst: time to first token (the first chunk with text)
p50 / p90 / p99 and mean, beside the server's own mean (`ts_time_to_first_token_seconds`: from the
request's arrival at the generation core; the rest is the client, HTTP and the door), aggregate
tokens/s (completion tokens from each stream's usage over the burst's wall time), the server's CPU
per token (/proc, its process tree) and the decode batch sizes the server ran
(`ts_generation_batch_size`). Prints JSON with the CPU and the load average.

    python -m bench.stream_admission --models models --model tinystories-gpt \
        --setup cap16="--gen-max-batch 16" --setup cap64="--gen-max-batch 64"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import openai

from bench.common import ServiceProcess, conditions, emit, histogram_delta, scrape_histogram, summary
from bench.procstat import cpu_seconds

log = logging.getLogger("bench.stream_admission")
TTFT = "ts_time_to_first_token_seconds"
PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She",
    "Tom and his dog went to the park. They",
    "The sun was shining and the birds were singing. Mia",
    "One day, a big red ball rolled into the garden.",
]


async def one_stream(sdk: openai.AsyncOpenAI, model: str, prompt: str, tokens: int, seed: int) -> tuple[float, int]:
    """(time to first token in ms, completion tokens) of one streamed completion."""
    started = time.perf_counter()
    first, used = None, 0
    stream = await sdk.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=tokens,
        temperature=0.8,
        seed=seed,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for event in stream:
        if first is None and event.choices and event.choices[0].text:
            first = (time.perf_counter() - started) * 1e3
        if event.usage is not None:
            used = event.usage.completion_tokens
    return (first if first is not None else float("nan")), used


async def one_http_stream(client, model: str, prompt: str, tokens: int, seed: int) -> tuple[float, int]:
    """`one_stream` over a bare HTTP client: the server-sent events read as lines and JSON, no SDK
    objects (what the SDK's own parsing costs, on the cores it shares with the server)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0.8,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, used = None, 0
    async with client.stream("POST", "/v1/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and event["choices"] and event["choices"][0]["text"]:
                first = (time.perf_counter() - started) * 1e3
            if event.get("usage"):
                used = event["usage"]["completion_tokens"]
    return (first if first is not None else float("nan")), used


async def burst(server: ServiceProcess, model: str, streams: int, tokens: int, client: str = "openai") -> dict:
    """`streams` concurrent streams, each on its own connection; what the burst measured."""
    if client == "http":
        import httpx2

        sdks: list = [httpx2.AsyncClient(base_url=server.http_url, timeout=300) for _ in range(streams)]
        stream: Callable[..., Awaitable[tuple[float, int]]] = one_http_stream
    else:
        sdks = [
            openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0, timeout=300)
            for _ in range(streams)
        ]
        stream = one_stream
    sizes = scrape_histogram(server.metrics_url, "ts_generation_batch_size") if server.metrics_url else None
    firsts = scrape_histogram(server.metrics_url, TTFT) if server.metrics_url else None
    cpu0, t0 = cpu_seconds(server.proc.pid), time.perf_counter()
    results = await asyncio.gather(
        *(stream(sdk, model, PROMPTS[i % len(PROMPTS)], tokens, seed=i) for i, sdk in enumerate(sdks))
    )
    wall, cpu = time.perf_counter() - t0, cpu_seconds(server.proc.pid) - cpu0
    for sdk in sdks:
        await (sdk.aclose() if client == "http" else sdk.close())
    ttft = sorted(r[0] for r in results)
    total = sum(r[1] for r in results)

    def pct(p: float) -> float:
        return round(ttft[min(len(ttft) - 1, int(p * len(ttft)))], 1)

    out = {
        "ttft_ms": {
            "p50": pct(0.5),
            "p90": pct(0.9),
            "p99": pct(0.99),
            "max": round(ttft[-1], 1),
            "mean": round(sum(ttft) / len(ttft), 1),
        },
        "tokens": total,
        "tokens_per_s": round(total / wall, 1),
        "server_cpu_us_per_token": round(cpu / max(total, 1) * 1e6, 1),
    }
    if sizes is not None:
        after = scrape_histogram(server.metrics_url, "ts_generation_batch_size")
        delta = histogram_delta(sizes, after)
        out["decode_steps"] = delta.get("count")
        out["mean_decode_batch"] = delta.get("mean")
    if firsts is not None:  # the server's own time to first token: arrival at the scheduler to the first token
        now = scrape_histogram(server.metrics_url, TTFT)
        count = now.get("count", 0.0) - firsts.get("count", 0.0)
        seconds = now.get("sum", 0.0) - firsts.get("sum", 0.0)
        out["server_ttft_mean_ms"] = round(seconds / count * 1e3, 1) if count else None
    return out


async def measure(server: ServiceProcess, args) -> dict:
    await burst(server, args.model, 8, 8, args.client)  # warm-up: graphs, allocations, connections
    out = {}
    for streams in (args.streams, 8, 1):
        out[f"{streams}_streams"] = await burst(server, args.model, streams, args.new_tokens, args.client)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--model", required=True, help="a generation model served from --models")
    ap.add_argument("--setup", action="append", default=[], help="NAME=FLAGS (server flags), repeatable")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--client",
        choices=("openai", "http"),
        default="openai",
        help="the openai SDK (a client per stream), or a bare HTTP client reading the events as JSON lines",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):  # a line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    setups = dict(s.split("=", 1) for s in args.setup) or {"defaults": ""}
    before = conditions()
    runs: dict[str, list[dict]] = {name: [] for name in setups}
    for r in range(args.rounds):
        for name, flags in setups.items():
            log.info("round %d: %s (%s)", r + 1, name, flags)
            server = ServiceProcess(args.models, shlex.split(flags), metrics=True)
            try:
                runs[name].append(asyncio.run(measure(server, args)))
            finally:
                server.stop()
            log.info("%s: %s", name, json.dumps(runs[name][-1]))
    result: dict = {
        "model": args.model,
        "streams": args.streams,
        "new_tokens": args.new_tokens,
        "client": args.client,
        "setups": {},
    }
    for name, rounds in runs.items():
        many, eight, one = (f"{args.streams}_streams", "8_streams", "1_streams")
        result["setups"][name] = {
            "flags": setups[name],
            f"ttft_p50_ms_at_{args.streams}": summary([x[many]["ttft_ms"]["p50"] for x in rounds], 1),
            f"ttft_p99_ms_at_{args.streams}": summary([x[many]["ttft_ms"]["p99"] for x in rounds], 1),
            f"ttft_mean_ms_at_{args.streams}": summary([x[many]["ttft_ms"]["mean"] for x in rounds], 1),
            f"server_ttft_mean_ms_at_{args.streams}": summary(
                [x[many].get("server_ttft_mean_ms") or 0.0 for x in rounds], 1
            ),
            f"tokens_per_s_at_{args.streams}": summary([x[many]["tokens_per_s"] for x in rounds], 1),
            f"server_cpu_us_per_token_at_{args.streams}": summary(
                [x[many]["server_cpu_us_per_token"] for x in rounds], 1
            ),
            "eight_over_one_streams": summary(
                [x[eight]["tokens_per_s"] / max(x[one]["tokens_per_s"], 1e-9) for x in rounds]
            ),
            "rounds": rounds,
        }
    emit({**result, "conditions": {"before": before, "after": conditions()}})


if __name__ == "__main__":
    main()
