"""Fill-mask over the Open Inference Protocol (adapter.py): outputs `token` BYTES,
`token_id` INT64 and `score` FP32, each [N, M, K]: M the most masks of any input, K = top_k; an input
with fewer masks is padded with token "", token_id -1, score 0."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.cores import Cores
from service.grpc.fillmask import fill_mask_query
from service.kserve.adapter import Produced
from service.kserve.parameters import fill
from service.kserve.tensors import Tensor
from service.models import ModelInfo
from service.proto import inference_pb2 as pb

PARAMETERS = ("top_k",)


def outputs(info: ModelInfo | None) -> dict[str, tuple[str, list[int]]]:
    return {"token": ("BYTES", [-1, -1, -1]), "token_id": ("INT64", [-1, -1, -1]), "score": ("FP32", [-1, -1, -1])}


async def infer(cores: Cores, model: str, texts: list[str], values: dict[str, Any], deadline: float | None) -> Produced:
    answer = await cores.fill_mask.fill_mask(
        fill_mask_query(fill(pb.FillMaskRequest(inputs=texts, model=model), values)), deadline
    )
    masks = [[[(c.token, c.token_id, c.score) for c in mask] for mask in masks] for masks in answer.results]
    return Produced(tensors(masks), answer.input_tokens, 0)


def tensors(results: list[list[list[tuple[str, int, float]]]]) -> list[Tensor]:
    """input -> mask -> candidates (token, id, score) as three [N, M, K] tensors, padded past an input's masks."""
    n, m = len(results), max(len(masks) for masks in results)
    k = max((len(c) for masks in results for c in masks), default=0)
    tokens = np.full((n, m, k), b"", dtype=object)
    ids = np.full((n, m, k), -1, dtype=np.int64)
    scores = np.zeros((n, m, k), dtype=np.float32)
    for i, masks in enumerate(results):
        for j, candidates in enumerate(masks):
            for c, (token, token_id, score) in enumerate(candidates):
                tokens[i, j, c], ids[i, j, c], scores[i, j, c] = token.encode(), token_id, score
    return [Tensor("token", "BYTES", tokens), Tensor("token_id", "INT64", ids), Tensor("score", "FP32", scores)]
