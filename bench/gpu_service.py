"""The service side of bench.gpu: clients of a running `python -m service`, and its CPU clock.

Every call goes over gRPC to the real server process (bench.common.ServiceProcess). Generation
is timed per stream from the client: time to the first token (TTFT) and the gaps between
tokens after it (a chunk carrying k tokens counts as k gaps of a k-th of its wait each).
`ServerClock` reads the server's CPU time (user + system, its child processes included) from
/proc, so each phase can say what the serving layer cost per call or per token.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np

from bench.embed_throughput import run_clients
from service.client import AsyncClient


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
            tokens, gaps, sent = [], [], time.perf_counter()
            first = last = None
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
    return {"tokens": [list(r[0]) for r in runs], "ttft": [r[1] for r in runs],
            "gaps": [g for r in runs for g in r[2]], "wall_s": wall, "tokens_total": count}


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


async def translate_all(address: str, sentences: list[str], per_call: int, in_flight: int,
                        max_length: int) -> tuple[list[str], float]:
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
