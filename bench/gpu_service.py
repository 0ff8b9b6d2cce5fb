"""The service side of bench.gpu: clients of a running `python -m service`, and its CPU clock.

Every call goes over gRPC to the real server process (bench.common.ServiceProcess). Generation
is timed per stream from the client: time to the first token (TTFT) and the gaps between
tokens after it (a chunk carrying k tokens counts as k gaps of a k-th of its wait each).
`ServerClock` reads the server's CPU time (user + system, its child processes included) from
/proc, so each phase can say what the serving layer cost per call or per token. `Workloads`
holds bench.gpu's phases against one server.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from bench.embed_throughput import run_clients
from client import AsyncClient


class ServerClock:
    """CPU seconds used by a process and its descendants, from /proc (Linux)."""

    def __init__(self, pid: int):
        self.pid, self.tick = pid, os.sysconf("SC_CLK_TCK")

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # the process ended while we looked
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children.get(pid, [])
        return tree

    def seconds(self) -> float:
        total = 0
        for pid in self._tree():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        return total / self.tick


async def embed_single(address: str, sentences: list[str], in_flight: int, model: str) -> tuple[float, np.ndarray]:
    """One sentence per call, `in_flight` calls at a time (bench.embed_throughput's clients)."""
    return await run_clients(address, sentences, in_flight, model)


async def embed_batched(address: str, sentences: list[str], per_call: int, in_flight: int, model: str) -> float:
    """Wall seconds for all sentences in calls of `per_call` inputs, `in_flight` calls at a time."""
    chunks = [sentences[i : i + per_call] for i in range(0, len(sentences), per_call)]
    async with AsyncClient(address, timeout=300) as client:

        async def worker(queue: list[list[str]]) -> None:
            while queue:
                await client.embed(queue.pop(), model=model)

        warm = chunks[: in_flight * 2]  # one shared queue
        await asyncio.gather(*(worker(warm) for _ in range(in_flight)))  # warm-up
        start = time.perf_counter()
        queue = list(chunks)
        await asyncio.gather(*(worker(queue) for _ in range(in_flight)))
        return time.perf_counter() - start


async def generate_streams(address: str, prompts: list[str], streams: int, new_tokens: int) -> dict:
    """`streams` concurrent greedy GenerateStream calls (prompts cycled): tokens per stream, TTFT
    and inter-token gaps (seconds), aggregate tokens/s over the wall time."""
    async with AsyncClient(address, timeout=600) as client:

        async def one(prompt: str) -> tuple[list[int], float, list[float]]:
            tokens: list[int] = []
            gaps: list[float] = []
            sent = time.perf_counter()
            first: float | None = None
            last = sent
            async for chunk in client.generate_stream(prompt, max_new_tokens=new_tokens):
                now = time.perf_counter()
                if chunk.token_ids and first is None:
                    first = now
                elif chunk.token_ids:
                    gaps += [(now - last) / len(chunk.token_ids)] * len(chunk.token_ids)
                last = now if chunk.token_ids else last
                tokens += chunk.token_ids
            return tokens, (first or time.perf_counter()) - sent, gaps

        start = time.perf_counter()
        runs = await asyncio.gather(*(one(prompts[i % len(prompts)]) for i in range(streams)))
        wall = time.perf_counter() - start
    count = sum(len(r[0]) for r in runs)
    return {
        "tokens": [list(r[0]) for r in runs],
        "ttft": [r[1] for r in runs],
        "gaps": [g for r in runs for g in r[2]],
        "wall_s": wall,
        "tokens_total": count,
    }


async def generate_for(address: str, prompts: list[str], streams: int, new_tokens: int, budget_s: float) -> dict:
    """`generate_streams` repeated until budget_s has passed (at least once), figures merged: the
    TTFT and gap samples of every pass, tokens over the summed wall time."""
    merged, end = None, time.perf_counter() + budget_s
    while merged is None or time.perf_counter() < end:
        run = await generate_streams(address, prompts, streams, new_tokens)
        if merged is None:
            merged = {**run, "passes": 1}
            continue
        for key in ("ttft", "gaps"):
            merged[key] += run[key]
        merged["wall_s"] += run["wall_s"]
        merged["tokens_total"] += run["tokens_total"]
        merged["passes"] += 1
    return merged


async def alone_and_together(address: str, prompts: list[str], new_tokens: int) -> tuple[list, list]:
    """Each prompt's greedy tokens generated alone (one call at a time), then all at once."""
    alone = [(await generate_streams(address, [p], 1, new_tokens))["tokens"][0] for p in prompts]
    together = (await generate_streams(address, prompts, len(prompts), new_tokens))["tokens"]
    return alone, together


async def translate_all(
    address: str, sentences: list[str], per_call: int, in_flight: int, max_length: int
) -> tuple[list[str], float]:
    """Greedy translations of all sentences in calls of `per_call`, `in_flight` at a time: texts
    in input order and the wall seconds of the measured pass (after a warm-up pass)."""
    chunks = [(i, sentences[i : i + per_call]) for i in range(0, len(sentences), per_call)]
    texts: list[str] = [""] * len(sentences)
    async with AsyncClient(address, timeout=600) as client:

        async def worker(queue: list) -> None:
            while queue:
                at, inputs = queue.pop()
                response = await client.translate(inputs, max_length=max_length)
                texts[at : at + len(inputs)] = [t.text for t in response.translations]

        warm = chunks[:in_flight]  # one shared queue
        await asyncio.gather(*(worker(warm) for _ in range(in_flight)))  # warm-up
        start = time.perf_counter()
        queue = list(chunks)
        await asyncio.gather(*(worker(queue) for _ in range(in_flight)))
        return texts, time.perf_counter() - start


def percentiles_ms(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(np.asarray(values) * 1e3, [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3)}


def _calls(measured: int, warm_up: int) -> int:
    """Calls a client workload made: the measured pass and its warm-up (the server's CPU clock
    runs through both)."""
    return measured + min(measured, warm_up)


class Workloads:
    """bench.gpu's client workloads against one running server; `phases()` -> name: callable -> figures.

    files: the JSON inputs (prompts, sentences, sources); st_vectors: sentence-transformers fp32
    vectors of the sentences (.npy, written by the PyTorch side) for the cosine check."""

    def __init__(self, address: str, pid: int, size: dict, files: dict, st_vectors: Path):
        self.address, self.clock, self.size, self.st_vectors = address, ServerClock(pid), size, st_vectors
        self.sentences, self.prompts, self.sources = (
            json.loads(files[k].read_text()) for k in ("sentences", "prompts", "sources")
        )

    def phases(self) -> dict[str, Callable[[], dict]]:
        return {
            "models": lambda: {"models": asyncio.run(self.models())},
            "generate_alone_and_together": self.alone,
            "embed_single": self.embed_single,
            "embed_batched": self.embed_batched,
            **{f"generate_{n}_streams": partial(self.streams, n) for n in self.size["streams"]},
            "translate": self.translate,
        }

    def _timed(self, coro, per: str, count_of: Callable) -> dict:
        """Runs coro (bounded), adding the server's CPU milliseconds per call or token."""
        cpu = self.clock.seconds()
        result = asyncio.run(asyncio.wait_for(coro, 300))
        figures = result if isinstance(result, dict) else {"result": result}
        figures[f"server_cpu_ms_per_{per}"] = round(1e3 * (self.clock.seconds() - cpu) / max(1, count_of(result)), 3)
        return figures

    async def models(self) -> list[dict]:
        async with AsyncClient(self.address) as client:
            return [
                {"name": m.name, "kind": m.kind, "variant": m.variant, "provider": m.execution_provider}
                for m in await client.models()
            ]

    def alone(self) -> dict:
        pair = asyncio.run(alone_and_together(self.address, self.prompts, self.size["new_tokens"]))
        return dict(zip(("alone", "together"), pair))

    def embed_single(self) -> dict:
        n, fly = len(self.sentences), self.size["embed_in_flight"]
        f = self._timed(embed_single(self.address, self.sentences, fly, ""), "call", lambda r: _calls(n, fly * 4))
        seconds, vectors = f.pop("result")
        ref = np.load(self.st_vectors)
        cos = (vectors * ref).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(ref, axis=1)
        return {
            **f,
            "in_flight": fly,
            "sentences_per_s": round(n / seconds, 1),
            "min_cosine_vs_st_fp32": float(cos.min()),
            "mean_cosine_vs_st_fp32": float(cos.mean()),
        }

    def embed_batched(self) -> dict:
        per, fly = self.size["embed_per_call"], self.size["embed_calls_in_flight"]
        calls = -(-len(self.sentences) // per)
        f = self._timed(
            embed_batched(self.address, self.sentences, per, fly, ""), "call", lambda r: _calls(calls, fly * 2)
        )
        return {
            **f,
            "per_call": per,
            "in_flight": fly,
            "sentences_per_s": round(len(self.sentences) / f.pop("result"), 1),
        }

    def streams(self, n: int) -> dict:
        f = self._timed(
            generate_for(self.address, self.prompts, n, self.size["new_tokens"], self.size["budget_s"]),
            "token",
            lambda r: r["tokens_total"],
        )
        return {
            "streams": n,
            "passes": f["passes"],
            "tokens_per_s": round(f["tokens_total"] / f["wall_s"], 1),
            "ttft_ms": percentiles_ms(f["ttft"]),
            "inter_token_ms": percentiles_ms(f["gaps"]),
            "tokens_total": f["tokens_total"],
            "server_cpu_ms_per_token": f["server_cpu_ms_per_token"],
        }

    def translate(self) -> dict:
        per, fly = self.size["per_call"], self.size["translate_in_flight"]
        f = self._timed(
            translate_all(self.address, self.sources, per, fly, self.size["max_length"]),
            "call",
            lambda r: _calls(-(-len(self.sources) // per), fly),
        )
        texts, seconds = f.pop("result")
        return {
            **f,
            "texts": texts,
            "sentences_per_s": round(len(self.sources) / seconds, 1),
            "per_call": per,
            "in_flight": fly,
        }
