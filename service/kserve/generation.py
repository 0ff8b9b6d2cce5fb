"""Generation over the Open Inference Protocol (adapter.py): one generation per text,
output `text_output` BYTES [N]."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from service.cores import Cores
from service.generation.core import join_chunks
from service.grpc.generation import generate_query
from service.kserve.adapter import Produced, texts_tensor
from service.kserve.parameters import fill
from service.models import ModelInfo
from service.proto import inference_pb2 as pb

PARAMETERS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "stop", "seed")


def outputs(info: ModelInfo | None) -> dict[str, tuple[str, list[int]]]:
    return {"text_output": ("BYTES", [-1])}


async def infer(cores: Cores, model: str, texts: list[str], values: dict[str, Any], deadline: float | None) -> Produced:
    """One generation per text, decoded together by the model's scheduler; admitted all or none."""
    queries = [
        dataclasses.replace(
            generate_query(fill(pb.GenerateRequest(prompt=text, model=model), values)), prompt_name=f"text[{i}]"
        )
        for i, text in enumerate(texts)
    ]
    generations = await cores.generation.generate_many(queries, deadline)
    try:
        results = await asyncio.gather(*(g.collect() for g in generations))
    finally:
        for generation in generations:  # frees the rows of every sequence when one fails or the call ends
            generation.cancel()
    done = [join_chunks(chunks) for chunks in results]  # the last chunk of each carries its token counts
    return Produced(
        [texts_tensor("text_output", [c.text for c in done])],
        sum(c.input_tokens for c in done),
        sum(c.output_tokens for c in done),
    )
