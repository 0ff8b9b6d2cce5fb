"""Embedding over the Open Inference Protocol (adapter.py): output `embedding` FP32 [N, D]."""

from __future__ import annotations

from typing import Any

from service.cores import Cores
from service.grpc.embedding import embed_query
from service.kserve.adapter import Produced
from service.kserve.parameters import fill
from service.kserve.tensors import Tensor
from service.models import ModelInfo
from service.proto import inference_pb2 as pb

PARAMETERS = ("normalize", "truncate", "dimensions", "prompt_name", "prompt")


def outputs(info: ModelInfo | None) -> dict[str, tuple[str, list[int]]]:
    return {"embedding": ("FP32", [-1, info.embedding_dimension if info else -1])}


async def infer(cores: Cores, model: str, texts: list[str], values: dict[str, Any], deadline: float | None) -> Produced:
    request = fill(pb.EmbedRequest(inputs=texts, model=model, encoding=pb.EMBEDDING_ENCODING_PACKED_FLOAT32), values)
    answer = await cores.embedding.embed(embed_query(request), deadline)
    return Produced([Tensor("embedding", "FP32", answer.vectors)], answer.input_tokens, 0)
