"""What structured output and chat cost the server: a real `python -m service`, the openai SDK.

- server CPU (user + system, /proc) per generated token of chat completions with and without a JSON
  schema (`response_format`), at 1 and 8 concurrent streams, sampled at temperature 1, the two
  sides alternating `--rounds` times;
- the schema's compile time (llguidance, in this process, fresh schemas so nothing is cached);
- time to first token of a streamed chat vs a streamed completion of the same prompt ids.

    python -m bench.structured_output --models DIR --model NAME [--rounds 5] [--tokens 48]

The model must have a chat template (docs/chat.md); the tiny chat checkpoints of the tests serve
(build/test-cache/chat-*/ after `pytest tests/service/http/test_http_chat.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai

from bench.common import ServiceProcess, conditions, emit, summary
from bench.procstat import cpu_seconds

MESSAGES: list[Any] = [{"role": "user", "content": "Describe a person as JSON."}]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "friends": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "friends"],
}


async def _cpu_per_token(sdk, pid: int, model: str, streams: int, tokens: int, schema: bool, seed: int) -> float:
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}} if schema else None
    extra = {"response_format": fmt} if fmt else {}
    before = cpu_seconds(pid)
    replies = await asyncio.gather(
        *(
            sdk.chat.completions.create(
                model=model, messages=MESSAGES, temperature=1.0, seed=seed + i, max_tokens=tokens, **extra
            )
            for i in range(streams)
        )
    )
    spent = cpu_seconds(pid) - before
    return spent / max(1, sum(r.usage.completion_tokens for r in replies)) * 1e6


async def _first_token(request) -> float:
    """Milliseconds from the call to its first event with text (a completion's or a chat delta's)."""
    started = time.perf_counter()
    stream = await request
    try:
        async for event in stream:
            choice = event.choices[0] if event.choices else None
            if choice is not None and (getattr(choice, "text", None) or getattr(choice.delta, "content", None)):
                break
        return (time.perf_counter() - started) * 1e3
    finally:
        await stream.close()


async def measure(server: ServiceProcess, args) -> dict:
    sdk = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        ids = (await http.post("/tokenize", json={"model": args.model, "messages": MESSAGES})).json()["tokens"]
    out: dict = {}
    for streams in (1, 8):
        free, schema = [], []
        for r in range(args.rounds):
            free.append(await _cpu_per_token(sdk, server.proc.pid, args.model, streams, args.tokens, False, r))
            schema.append(await _cpu_per_token(sdk, server.proc.pid, args.model, streams, args.tokens, True, r))
        out[f"cpu_us_per_token_{streams}_streams"] = {"free": summary(free), "json_schema": summary(schema)}
    chat, plain = [], []
    for _ in range(args.rounds):
        common = dict(model=args.model, max_tokens=8, stream=True)
        chat.append(await _first_token(sdk.chat.completions.create(messages=MESSAGES, **common)))
        plain.append(await _first_token(sdk.completions.create(prompt=ids, **common)))
    out["ttft_ms"] = {"chat": summary(chat), "completions_same_ids": summary(plain)}
    return out


def compile_ms(models: Path, model: str, rounds: int) -> dict:
    """Fresh schemas (a property renamed each time) compiled against the model's tokenizer."""
    from service.generation.constraint import Constraints, Structure
    from service.manifest import load_model_dir
    from service.tokenizing import load

    model_dir = load_model_dir(models / model)
    tokenizer = load(model_dir.file(model_dir.manifest.tokenizer["file"]))
    constraints = Constraints(tokenizer, tokenizer.get_vocab_size(with_added_tokens=True), frozenset([0]))
    times = []
    for i in range(rounds + 1):
        schema = {**SCHEMA, "properties": {**SCHEMA["properties"], f"field{i}": {"type": "number"}}}
        started = time.perf_counter()
        asyncio.run(constraints.compile(Structure("json_schema", schema, "bench")))
        times.append((time.perf_counter() - started) * 1e3)
    return {"first_with_tokenizer_ms": round(times[0], 2), "fresh_schema_ms": summary(times[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--model", required=True, help="a generation model with a chat template")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    before = conditions()
    server = ServiceProcess(args.models, [])
    try:
        result = asyncio.run(measure(server, args))
    finally:
        server.stop()
    result["schema_compile"] = compile_ms(args.models, args.model, args.rounds)
    emit({"model": args.model, **result, "conditions": {"before": before, "after": conditions()}})


if __name__ == "__main__":
    main()
