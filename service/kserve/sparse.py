"""Sparse embeddings over the Open Inference Protocol (adapter.py), in compressed-row form: outputs
`indices` INT64 [K] and `values` FP32 [K], every input's non-zero entries one after the other, and
`offsets` INT64 [N + 1], where each input's entries start (input i: offsets[i]..offsets[i + 1])."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.cores import Cores
from service.grpc.sparse import sparse_query
from service.kserve.adapter import Produced
from service.kserve.parameters import fill
from service.kserve.tensors import Tensor
from service.models import ModelInfo
from service.proto import inference_pb2 as pb

PARAMETERS = ("truncate", "prompt_name", "prompt")


def outputs(info: ModelInfo | None) -> dict[str, tuple[str, list[int]]]:
    return {"indices": ("INT64", [-1]), "values": ("FP32", [-1]), "offsets": ("INT64", [-1])}


async def infer(cores: Cores, model: str, texts: list[str], values: dict[str, Any], deadline: float | None) -> Produced:
    request = fill(pb.EmbedSparseRequest(inputs=texts, model=model), values)
    answer = await cores.sparse.embed_sparse(sparse_query(request), deadline)
    counts = [len(v.indices) for v in answer.vectors]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (N + 1,)
    indices = np.concatenate([v.indices for v in answer.vectors]).astype(np.int64)  # (K,)
    weights = np.concatenate([v.values for v in answer.vectors]).astype(np.float32)  # (K,)
    tensors = [Tensor("indices", "INT64", indices), Tensor("values", "FP32", weights)]
    return Produced([*tensors, Tensor("offsets", "INT64", offsets)], answer.input_tokens, 0)
